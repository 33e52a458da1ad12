"""What the blocking and asyncio clients share: the constructor and settings,
embed()'s arguments (declared once, in :func:`embed_call`) and the request
they become, and the book-keeping of embed_stream.

The clients differ only in how they wait: `grpc` or `grpc.aio` channels, and
plain or ``async`` methods.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
from typing import (TYPE_CHECKING, Any, AsyncIterable, AsyncIterator,
                    Callable, Deque, Dict, Generic, Iterable, Iterator,
                    Mapping, NamedTuple, Optional, Sequence, Tuple, TypedDict,
                    TypeVar, Union)

import grpc
import numpy as np

from temb import _channel, _codec, _transport
from temb._proto.temb.v1 import temb_pb2 as pb
from temb._proto.temb.v1 import temb_pb2_grpc as pb_grpc
from temb.errors import TembError, error_from_code, error_from_rpc

if TYPE_CHECKING:
    from typing_extensions import Concatenate, ParamSpec, Unpack
    _P = ParamSpec("_P")

_R = TypeVar("_R")

# What embed() returns: numpy.ndarray, or torch.Tensor for return_tensors="pt";
# a multi-part call returns a dict of them by part name.
Embedding = Any


class ClientBase:
    """The constructor of both clients; see :class:`temb.Client` for its
    arguments."""

    # grpc or grpc.aio, set by each client: both make channels with the same
    # arguments.
    _grpc: Any
    # The transports a client takes (temb._transport).
    _TRANSPORTS: Tuple[str, ...] = _transport.TRANSPORTS
    _EMBED_METHOD = f"/{_channel.SERVICE}/Embed"

    def __init__(self, target: str, *, timeout: Optional[float] = None,
                 retries: int = _channel.DEFAULT_RETRIES,
                 tls: _channel.TlsOption = None,
                 auth_token: Optional[str] = None,
                 max_message_bytes: int = _channel.DEFAULT_MAX_MESSAGE_BYTES,
                 options: Sequence[Tuple[str, Any]] = (),
                 transport: str = "auto") -> None:
        if transport not in self._TRANSPORTS:
            raise ValueError(f"transport must be one of {self._TRANSPORTS} "
                             f"for {type(self).__module__}.Client, got "
                             f"{transport!r}")
        self._target = target
        self._timeout = timeout
        # What it takes to open an equal client elsewhere (temb.torch modules
        # re-create their connection after unpickling).
        self._arguments: Dict[str, Any] = dict(
            target=target, timeout=timeout, retries=retries, tls=tls,
            auth_token=auth_token, max_message_bytes=max_message_bytes,
            options=tuple(options), transport=transport)
        self._metadata = _channel.auth_metadata(auth_token)
        credentials = _channel.credentials(tls)
        channel_options = _channel.channel_options(retries, max_message_bytes,
                                                   tls, options)
        if credentials is None:
            self._channel = self._grpc.insecure_channel(
                target, options=channel_options)
        else:
            self._channel = self._grpc.secure_channel(
                target, credentials, options=channel_options)
        self._stub = pb_grpc.EmbeddingServiceStub(self._channel)
        self._open_transport(transport, channel_options)
        # Raw bytes in and out: see _codec.encode_health_request.
        self._health_check = self._channel.unary_unary(
            _channel.HEALTH_CHECK_METHOD, request_serializer=None,
            response_deserializer=None)

    def _open_transport(self, transport: str, options: Any) -> None:
        """Sets up what embed calls travel on: the native channel when the
        transport and the settings allow it, and the gRPC channel's method
        for serialized requests (no serializer: bytes pass)."""
        self._native, self._transport_reason = _transport.native_channel(
            transport, self._target, self._arguments["tls"], options,
            self._metadata)
        if self._native is not None:
            _transport.track(self)
        self._embed_bytes = self._channel.unary_unary(
            self._EMBED_METHOD, request_serializer=None,
            response_deserializer=None)
        self._plans = EmbedPlans()

    def _forget_native(self) -> Any:
        """In a forked child: embed calls move to grpcio (temb._transport);
        returns what the client held."""
        native, self._native = self._native, None
        self._transport_reason = _transport.FORKED_REASON
        return native

    @property
    def transport(self) -> str:
        """"native" or "grpcio": what this client's embed calls use."""
        return "grpcio" if self._native is None else "native"

    @property
    def transport_reason(self) -> Optional[str]:
        """Why this client's embed calls use grpcio (asked for, settings
        only grpcio takes, no native extension: what the package's build
        lacked), or None on the native transport."""
        return self._transport_reason

    @property
    def target(self) -> str:
        return self._target

    @property
    def settings(self) -> Dict[str, Any]:
        """The arguments this client was made with (a copy): an equal
        client, in this process or another, is
        ``type(client)(**client.settings)`` (temb.torch's modules reopen
        theirs so after unpickling)."""
        return dict(self._arguments)

    def _call_options(self, timeout: Optional[float]) -> Dict[str, Any]:
        """The keyword arguments of one gRPC call: deadline and metadata."""
        return {"timeout": self._timeout if timeout is None else timeout,
                "metadata": self._metadata}


@contextlib.contextmanager
def rpc_errors(request_id: Optional[str] = "") -> Iterator[None]:
    """Raises what grpc raises (sync or asyncio) as a TembError."""
    try:
        yield
    except grpc.RpcError as e:
        raise error_from_rpc(e, request_id) from None


class ResponseDecoder(NamedTuple):
    """How to turn an EmbedResponse into what embed() returns: one tensor of
    `shapes[0]` + [dim], or (for a multi-part request, `names` set) a dict
    of the named parts' tensors."""

    decoding: _codec.Decoding
    shapes: Tuple[Tuple[int, ...], ...]
    names: Optional[Tuple[str, ...]] = None

    def decode(self, response: pb.EmbedResponse
               ) -> Union[Embedding, Dict[str, Embedding]]:
        if self.names is None:
            return _codec.decode_tensor(response.embedding, self.decoding,
                                        self.shapes[0])
        got = tuple(part.name for part in response.parts)
        if got != self.names:
            raise TembError(grpc.StatusCode.DATA_LOSS,
                            f"response parts {list(got)} do not answer the "
                            f"requested parts {list(self.names)}")
        return {part.name: _codec.decode_tensor(part.tensor, self.decoding,
                                                shape)
                for part, shape in zip(response.parts, self.shapes)}

    def decode_array(self, array: np.ndarray) -> Embedding:
        """The same for a response's single tensor already read into an
        array (the native transport's embed; bf16 as uint16 bits)."""
        if self.names is not None or array.shape[:-1] != self.shapes[0]:
            expected = ("parts " + str(list(self.names)) if self.names
                        else f"shape {list(self.shapes[0])} + [dim]")
            raise TembError(grpc.StatusCode.DATA_LOSS,
                            f"response tensor of shape {list(array.shape)} "
                            f"does not answer the request (expected "
                            f"{expected})")
        return _codec.finish_array(array, self.decoding)


class EmbedCall(NamedTuple):
    request: pb.EmbedRequest
    decoder: ResponseDecoder
    timeout: Optional[float]


class SpecOptions(TypedDict, total=False):
    """The keyword arguments that fill an EmbeddingSpec besides `dim`
    (embed()'s and a part's); None leaves a field unset."""
    max_period: Optional[float]
    flip_sin_to_cos: Optional[bool]
    downscale_freq_shift: Optional[float]
    scale: Optional[float]
    time_factor: Optional[float]
    repeat_only: Optional[bool]
    layout: Optional[str]
    exponent_order: Optional[str]
    precision: Optional[str]
    timestep_dtype: Any
    frequencies: Optional[Sequence[float]]
    log_spaced_frequencies: Optional[Tuple[float, float]]


_SCALAR_FIELDS = ("max_period", "flip_sin_to_cos", "downscale_freq_shift",
                  "scale", "time_factor", "repeat_only")
_ENUM_FIELDS = ("layout", "exponent_order", "precision", "timestep_dtype")
SPEC_KEYWORDS = ("dim",) + tuple(SpecOptions.__annotations__)
# What a part given as a mapping may hold.
PART_KEYWORDS = frozenset(("timesteps", "preset", "dtype") + SPEC_KEYWORDS)


def fill_spec(spec: pb.EmbeddingSpec, dim: Optional[int] = None,
              **options: Unpack[SpecOptions]) -> None:
    """Sets the fields of `spec` that are not None."""
    unknown = sorted(set(options) - set(SPEC_KEYWORDS))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}; the "
                        f"convention's are {list(SPEC_KEYWORDS)}")
    given: Dict[str, Any] = {name: value for name, value in options.items()
                             if value is not None}
    if dim is not None:
        spec.dim = int(dim)
    for name in _SCALAR_FIELDS:
        if name in given:
            setattr(spec, name, given[name])
    for name in _ENUM_FIELDS:
        if name in given:
            setattr(spec, name, _codec.enum_value(name, given[name]))
    if "frequencies" in given:
        spec.frequencies.extend(_codec.frequencies_list(given["frequencies"]))
    if "log_spaced_frequencies" in given:
        low, high = given["log_spaced_frequencies"]
        spec.log_spaced_frequencies.min_frequency = float(low)
        spec.log_spaced_frequencies.max_frequency = float(high)


def _encode_part(part: pb.EmbedPart, name: Any, value: Any) -> Tuple[int, ...]:
    if not isinstance(name, str) or not name:
        raise TypeError(f"part names must be non-empty strings, got {name!r}")
    part.name = name
    if not isinstance(value, Mapping):
        return _codec.encode_timesteps(part, value)
    options = dict(value)
    unknown = sorted(set(options) - PART_KEYWORDS)
    if unknown:
        raise TypeError(f"part {name!r}: unknown keys {unknown}; a part takes "
                        f"{sorted(PART_KEYWORDS)}")
    if "timesteps" not in options:
        raise TypeError(f"part {name!r} has no timesteps")
    timesteps = options.pop("timesteps")
    part.preset = options.pop("preset", None) or ""
    dtype = options.pop("dtype", None)
    if dtype is not None:
        part.dtype = _codec.enum_value("dtype", dtype)
    fill_spec(part.spec, **options)
    return _codec.encode_timesteps(part, timesteps)


def _spelled_out(function: Callable[..., _R]) -> Callable[..., _R]:
    """`function`, whose signature shows its **spec (SpecOptions) as the
    keyword-only parameters they are, default None: help(), IDEs and the
    clients' methods made from it (with_parameters_of) list them."""
    signature = inspect.signature(function)
    parameters = [p for p in signature.parameters.values()
                  if p.kind != inspect.Parameter.VAR_KEYWORD]
    parameters += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                     default=None, annotation=annotation)
                   for name, annotation in SpecOptions.__annotations__.items()]
    function.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters)
    return function


@_spelled_out
def embed_call(timesteps: Any = None, dim: Optional[int] = None,
               preset: Optional[str] = None, dtype: Any = None, *,
               parts: Optional[Mapping[str, Any]] = None,
               request_id: Optional[str] = None,
               timeout: Optional[float] = None,
               return_tensors: str = "np",
               bf16_format: str = "auto",
               **spec: Unpack[SpecOptions]) -> EmbedCall:
    """The arguments of :meth:`temb.Client.embed`, checked and encoded; None
    leaves a field of the EmbedRequest unset.  `spec`: the convention's
    fields (SpecOptions)."""
    decoding = _codec.make_decoding(return_tensors, bf16_format)
    request = pb.EmbedRequest(request_id=request_id or "", preset=preset or "")
    if dtype is not None:
        request.dtype = _codec.enum_value("dtype", dtype)
    fill_spec(request.spec, dim, **spec)
    if parts is None:
        if timesteps is None:
            raise TypeError("embed() needs timesteps (or parts=)")
        shape = _codec.encode_timesteps(request, timesteps)
        return EmbedCall(request, ResponseDecoder(decoding, (shape,)), timeout)
    if timesteps is not None:
        raise TypeError("give either timesteps or parts=, not both: each "
                        "part carries its own timesteps")
    if not isinstance(parts, Mapping):
        raise TypeError("parts must be a mapping of part name to timesteps "
                        "(or to a dict of options), got "
                        f"{type(parts).__name__}")
    if not parts:
        raise ValueError("parts is empty")
    shapes = tuple(_encode_part(request.parts.add(), name, value)
                   for name, value in parts.items())
    decoder = ResponseDecoder(decoding, shapes, tuple(parts))
    return EmbedCall(request, decoder, timeout)


def embed_parts_call(parts: Mapping[str, Any], preset: Optional[str] = None,
                     dtype: Any = None, **options: Any) -> EmbedCall:
    """The arguments of :meth:`temb.Client.embed_parts`: embed_call's, with
    the parts first, then preset and dtype, and the others (dim included)
    by keyword only, as its signature (made from embed_call's below)
    shows."""
    if "timesteps" in options:  # embed_call's, not embed_parts'
        raise TypeError("embed_parts() got an unexpected keyword argument "
                        "'timesteps': each part carries its own timesteps")
    return embed_call(None, preset=preset, dtype=dtype, parts=parts,
                      **options)


def _parts_first(signature: inspect.Signature) -> inspect.Signature:
    """embed_call's signature as embed_parts_call takes the arguments."""
    parameters = signature.parameters
    parts = parameters["parts"].replace(
        kind=inspect.Parameter.POSITIONAL_OR_KEYWORD,
        default=inspect.Parameter.empty, annotation="Mapping[str, Any]")
    keywords = [parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY)
                for name, parameter in parameters.items()
                if name not in ("timesteps", "parts", "preset", "dtype")]
    return signature.replace(parameters=[
        parts, parameters["preset"], parameters["dtype"], *keywords])


embed_parts_call.__signature__ = _parts_first(  # type: ignore[attr-defined]
    inspect.signature(embed_call))


def with_parameters_of(
        template: Callable[_P, Any]
) -> Callable[[Callable[..., _R]], Callable[Concatenate[Any, _P], _R]]:
    """Shows `method(self, *args, **kwargs)` as taking `template`'s
    parameters, to help(), IDEs and type checkers."""
    def decorate(method: Callable[..., _R]) -> Any:
        own = inspect.signature(method)
        self_parameter = next(iter(own.parameters.values()))
        parameters = inspect.signature(template).parameters.values()
        method.__signature__ = own.replace(  # type: ignore[attr-defined]
            parameters=[self_parameter, *parameters])
        return method
    return decorate


# What an embed function (temb.Client.embed_function,
# temb.local.Engine.embed_function) does not take: its calls bring the
# timesteps, of one tensor, without a request id.
_NOT_FUNCTION_ARGUMENTS = frozenset(("timesteps", "parts", "request_id"))


def check_function_arguments(arguments: Mapping[str, Any]) -> None:
    """TypeError when embed_function() is given what it does not take."""
    given = sorted(_NOT_FUNCTION_ARGUMENTS.intersection(arguments))
    if given:
        raise TypeError("embed_function() takes embed()'s arguments but "
                        f"timesteps, parts and request_id; got {given}")


class PreparedEmbed(NamedTuple):
    """An embed() call ready to send: `head` is the serialized request
    without `timesteps` (None: `head` is the whole request) and without
    `request_id`; `timesteps` is float32 or int64, C-contiguous."""

    head: bytes
    request_id: str
    timesteps: Optional[np.ndarray]
    decoder: ResponseDecoder
    timeout: Optional[float]

    def request_bytes(self) -> bytes:
        """The whole serialized request."""
        if self.timesteps is None:
            return self.head
        tail = pb.EmbedRequest(request_id=self.request_id)
        _codec.encode_timesteps(tail, self.timesteps)
        return self.head + tail.SerializeToString()


def decode_embed_result(call: PreparedEmbed, data: Any) -> Embedding:
    """What embed() returns for `call` from the transport's answer: the
    response bytes, or the native transport's array of a single-tensor
    response."""
    if isinstance(data, bytes):
        return call.decoder.decode(pb.EmbedResponse.FromString(data))
    return call.decoder.decode_array(data)


def request_head(request: pb.EmbedRequest) -> bytes:
    """`request` serialized without its timesteps and request_id: what
    calls with the same arguments share (PreparedEmbed.head)."""
    template = pb.EmbedRequest()
    template.CopyFrom(request)
    for field in ("request_id", "timesteps", "integer_timesteps",
                  "timesteps_shape"):
        template.ClearField(field)
    return template.SerializeToString()


class EmbedPlans:
    """Prepared requests of repeated embed() calls.

    A pipeline calls embed() with the same arguments at every step and new
    timesteps.  The first call with a set of arguments checks and encodes
    them (:func:`embed_call`) and keeps the request without its timesteps
    and request_id, serialized; later calls add only those (protobuf's wire
    format merges concatenated messages, repeated fields appending).  Calls
    with parts, or with arguments that cannot be dict keys (lists of
    frequencies), are encoded whole each time.
    """

    _MAX_PLANS = 256

    def __init__(self) -> None:
        self._plans: Dict[Any, Tuple[bytes, _codec.Decoding]] = {}

    def prepare(self, args: Tuple[Any, ...],
                kwargs: Dict[str, Any]) -> PreparedEmbed:
        """``embed(*args, **kwargs)``, prepared."""
        options = dict(kwargs)
        timeout = options.pop("timeout", None)
        request_id = options.pop("request_id", None) or ""
        if args:
            timesteps, rest = args[0], args[1:]
        else:
            timesteps, rest = options.pop("timesteps", None), ()
        key = None
        if timesteps is not None and options.get("parts") is None:
            # In the caller's keyword order: one call site repeats it.
            key = (rest, tuple(options.items()))
            try:
                hash(key)
            except TypeError:
                key = None
        plan = self._plans.get(key) if key is not None else None
        if plan is None:
            call = embed_call(*args, **kwargs)
            if key is not None:
                if len(self._plans) >= self._MAX_PLANS:
                    self._plans.clear()
                self._plans[key] = (request_head(call.request),
                                    call.decoder.decoding)
            return PreparedEmbed(call.request.SerializeToString(), request_id,
                                 None, call.decoder, timeout)
        head, decoding = plan
        array = np.ascontiguousarray(_codec.timesteps_array(timesteps))
        shape = tuple(array.shape) if array.ndim > 1 else (array.size,)
        return PreparedEmbed(head, request_id, array,
                             ResponseDecoder(decoding, (shape,)), timeout)


# Both clients' embed() and embed_parts() take exactly embed_call's and
# embed_parts_call's arguments, so that they are declared in one place.
takes_embed_arguments = with_parameters_of(embed_call)
takes_embed_parts_arguments = with_parameters_of(embed_parts_call)


_Request = TypeVar("_Request")
_Decoder = TypeVar("_Decoder")


class _Stream(Generic[_Request, _Decoder]):
    """Book-keeping for a stream: each request's id and how to decode its
    answer, in request order, and an error raised while building a request
    (re-raised after the stream).  A subclass says how an item becomes a
    request (call) and how an answer is decoded (decode)."""

    method = ""  # the client's method the stream stands for

    def __init__(self) -> None:
        self.pending: Deque[Tuple[str, _Decoder]] = collections.deque()
        self.error: Optional[BaseException] = None

    def call(self, item: Mapping[str, Any]) -> Tuple[_Request, str, _Decoder]:
        raise NotImplementedError

    def decode(self, decoder: _Decoder, answer: Any) -> Any:
        raise NotImplementedError

    def request(self, item: Mapping[str, Any]) -> _Request:
        if "timeout" in item:
            raise TypeError(f"{self.method}_stream items take no timeout: the "
                            "stream's timeout bounds them all")
        request, request_id, decoder = self.call(item)
        self.pending.append((request_id, decoder))
        return request

    def result(self, response: Any, raise_errors: bool) -> Any:
        """The next answer, decoded, or its TembError (raised when
        `raise_errors`)."""
        request_id, decoder = self.pending.popleft()
        if response.WhichOneof("result") == "error":
            error = error_from_code(response.error.code,
                                    response.error.message,
                                    response.request_id or request_id)
            if raise_errors:
                raise error
            return error
        return self.decode(decoder, response.response)

    def requests(self, items: Iterable[Mapping[str, Any]]
                 ) -> Iterator[_Request]:
        try:
            for item in items:
                yield self.request(item)
        except Exception as e:  # surfaced to the caller after the stream
            self.error = e

    async def async_requests(self, items: AsyncIterable[Mapping[str, Any]]
                             ) -> AsyncIterator[_Request]:
        try:
            async for item in items:
                yield self.request(item)
        except Exception as e:  # surfaced to the caller after the stream
            self.error = e


class StreamState(_Stream[pb.EmbedRequest, ResponseDecoder]):
    """_Stream for embed_stream: items are embed()'s keyword arguments."""

    method = "embed"

    def call(self, item: Mapping[str, Any]
             ) -> Tuple[pb.EmbedRequest, str, ResponseDecoder]:
        call = embed_call(**item)
        return call.request, call.request.request_id, call.decoder

    def decode(self, decoder: ResponseDecoder, answer: Any
               ) -> Union[Embedding, Dict[str, Embedding]]:
        return decoder.decode(answer)


def condition_call(model: str, timesteps: Any = None, guidance: Any = None,
                   pooled_projections: Any = None, outputs: Any = None,
                   return_tensors: Optional[str] = None, *,
                   request_id: Optional[str] = None, bf16_format: str = "auto",
                   **extras: Any
                   ) -> Tuple[pb.ConditionRequest, _codec.Decoding]:
    """A condition() call's request and how to decode its answer."""
    decoding = _codec.make_decoding(return_tensors or "np", bf16_format)
    request = _codec.condition_request(
        model, {"timesteps": timesteps, "guidance": guidance,
                "pooled_projections": pooled_projections, **extras},
        outputs, request_id)
    return request, decoding


class ConditionStreamState(_Stream[pb.ConditionRequest, _codec.Decoding]):
    """_Stream for condition_stream: items are condition()'s keyword
    arguments, answers dicts of outputs."""

    method = "condition"

    def call(self, item: Mapping[str, Any]
             ) -> Tuple[pb.ConditionRequest, str, _codec.Decoding]:
        request, decoding = condition_call(**item)
        return request, request.request_id, decoding

    def decode(self, decoder: _codec.Decoding, answer: Any) -> Any:
        return _codec.condition_result(answer, decoder)
