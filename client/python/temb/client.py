"""The blocking temb client.

One :class:`Client` wraps one gRPC channel; it is thread-safe, so a pipeline
should create it once and share it.  Calls raise :class:`temb.TembError`
(a subclass per status code) on failure.
"""

from __future__ import annotations

import collections
from typing import (Any, Deque, Iterable, Iterator, Mapping, Optional,
                    Sequence, Tuple, Union)

import grpc

from temb import _channel, _codec
from temb._proto.temb.v1 import temb_pb2 as pb
from temb._proto.temb.v1 import temb_pb2_grpc as pb_grpc
from temb.errors import TembError, error_from_code, error_from_rpc
from temb.types import HealthStatus, ServerInfo

__all__ = ["Client"]

# What embed() returns: numpy.ndarray, or torch.Tensor for return_tensors="pt".
Embedding = Any


class _Settings:
    """Constructor arguments shared by the blocking and asyncio clients."""

    def __init__(self, target: str, timeout: Optional[float], retries: int,
                 tls: _channel.TlsOption, auth_token: Optional[str],
                 max_message_bytes: int,
                 options: Sequence[Tuple[str, Any]]) -> None:
        self.target = target
        self.timeout = timeout
        self.credentials = _channel.credentials(tls)
        self.options = _channel.channel_options(retries, max_message_bytes,
                                                tls, options)
        self.metadata = _channel.auth_metadata(auth_token)

    def deadline(self, timeout: Optional[float]) -> Optional[float]:
        return self.timeout if timeout is None else timeout


class _StreamState:
    """Book-keeping for embed_stream: decodings in request order, and an
    error raised while building a request (re-raised after the stream)."""

    def __init__(self) -> None:
        self.pending: Deque[Tuple[str, _codec.Decoding]] = collections.deque()
        self.error: Optional[BaseException] = None

    def request(self, item: Mapping[str, Any]) -> pb.EmbedRequest:
        kwargs, decoding = _codec.split_embed_kwargs(item)
        request = _codec.build_request(**kwargs)
        self.pending.append((request.request_id, decoding))
        return request

    def result(self, response: pb.EmbedStreamResponse,
               raise_errors: bool) -> Union[Embedding, TembError]:
        request_id, decoding = self.pending.popleft()
        if response.WhichOneof("result") == "error":
            error = error_from_code(response.error.code,
                                    response.error.message,
                                    response.request_id or request_id)
            if raise_errors:
                raise error
            return error
        return _codec.decode_tensor(response.response.embedding, decoding)


class Client:
    """A connection to a temb server.

    Args:
      target: "host:port" (any gRPC target, e.g. "dns:///temb.svc:50051").
      timeout: default deadline of each call in seconds (None: no deadline).
      retries: how many times a call failing with UNAVAILABLE is retried,
        with exponential backoff (gRPC service-config retry policy, at most
        4).  0 disables retries.
      tls: None/False for plaintext, True for TLS with default roots, a
        :class:`temb.TlsConfig` (custom roots, client certificate and key),
        or ready-made ``grpc.ChannelCredentials``.
      auth_token: sent as ``authorization: Bearer <token>`` with every call.
      max_message_bytes: gRPC send/receive limit of this client.
      options: extra gRPC channel arguments.
    """

    def __init__(self, target: str, *, timeout: Optional[float] = None,
                 retries: int = _channel.DEFAULT_RETRIES,
                 tls: _channel.TlsOption = None,
                 auth_token: Optional[str] = None,
                 max_message_bytes: int = _channel.DEFAULT_MAX_MESSAGE_BYTES,
                 options: Sequence[Tuple[str, Any]] = ()) -> None:
        self._settings = _Settings(target, timeout, retries, tls, auth_token,
                                   max_message_bytes, options)
        s = self._settings
        if s.credentials is None:
            self._channel = grpc.insecure_channel(target, options=s.options)
        else:
            self._channel = grpc.secure_channel(target, s.credentials,
                                                options=s.options)
        self._stub = pb_grpc.EmbeddingServiceStub(self._channel)
        # Raw bytes in and out: see _codec.encode_health_request.
        self._health_check = self._channel.unary_unary(
            _channel.HEALTH_CHECK_METHOD, request_serializer=None,
            response_deserializer=None)

    @property
    def target(self) -> str:
        return self._settings.target

    def embed(self, timesteps: Any, dim: Optional[int] = None,
              preset: Optional[str] = None, dtype: Optional[str] = None, *,
              max_period: Optional[float] = None,
              flip_sin_to_cos: Optional[bool] = None,
              downscale_freq_shift: Optional[float] = None,
              scale: Optional[float] = None,
              time_factor: Optional[float] = None,
              repeat_only: Optional[bool] = None,
              layout: Optional[str] = None,
              precision: Optional[str] = None,
              request_id: Optional[str] = None,
              timeout: Optional[float] = None,
              return_tensors: str = "np",
              bf16_format: str = "auto") -> Embedding:
        """Computes the [N, dim] embedding of N timesteps.

        Args:
          timesteps: a list, numpy array or torch tensor (0-D or 1-D).
            Floating values are sent as float32 (like diffusers'
            ``timesteps.float()``); integer values as integers.
          dim, preset, max_period, flip_sin_to_cos, downscale_freq_shift,
            scale, time_factor, repeat_only: the convention, with diffusers'
            names.  None leaves a field unset: with a preset the preset
            decides; without one, dim, flip_sin_to_cos and
            downscale_freq_shift are required by the server.
          dtype: "fp32" | "fp16" | "bf16" | "fp64" (None: the preset's
            default, else fp32).  fp16/bf16 are the fp32 result rounded to
            nearest even.
          layout: "halves" | "interleaved".  precision: "fp32" | "fp64".
          request_id: echoed by the server, for tracing.
          timeout: this call's deadline in seconds (None: the client's).
          return_tensors: "np" (numpy) or "pt" (a CPU torch tensor).
          bf16_format: numpy representation of bf16 results: "auto"
            (ml_dtypes.bfloat16 when installed, else "float32"), "float32"
            (float32 holding the exact bf16 values), "bits" (raw uint16),
            "ml_dtypes".

        Returns:
          A writable array of shape [N, dim]: float32/float16/float64 for
          those dtypes; bf16 as described above (torch.bfloat16 with "pt").

        Raises:
          TembError (InvalidArgumentError, NotFoundError,
          ResourceExhaustedError, ...), ValueError/TypeError for arguments
          that cannot be encoded at all.
        """
        decoding = _codec.make_decoding(return_tensors, bf16_format)
        request = _codec.build_request(
            timesteps, dim=dim, preset=preset, dtype=dtype,
            max_period=max_period, flip_sin_to_cos=flip_sin_to_cos,
            downscale_freq_shift=downscale_freq_shift, scale=scale,
            time_factor=time_factor, repeat_only=repeat_only, layout=layout,
            precision=precision, request_id=request_id)
        try:
            response = self._stub.Embed(
                request, timeout=self._settings.deadline(timeout),
                metadata=self._settings.metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e, request_id) from None
        return _codec.decode_tensor(response.embedding, decoding)

    def embed_stream(self, requests: Iterable[Mapping[str, Any]], *,
                     timeout: Optional[float] = None,
                     raise_errors: bool = True
                     ) -> Iterator[Union[Embedding, TembError]]:
        """Runs many requests over one stream; yields results in order.

        Each item of `requests` is a mapping of :meth:`embed`'s keyword
        arguments (``timesteps`` included, ``timeout`` excluded).  Items are
        consumed lazily, so the iterable may be a generator.

        Errors: a request the server rejects raises its TembError when
        `raise_errors` (the stream is then cancelled), or is yielded as a
        TembError in its place otherwise, and the stream goes on.  A failure
        of the stream itself (e.g. UNAVAILABLE, DEADLINE_EXCEEDED) always
        raises.  An item that cannot be encoded ends the stream after the
        results before it and raises its ValueError/TypeError.

        `timeout` bounds the whole stream.
        """
        state = _StreamState()

        def request_iterator() -> Iterator[pb.EmbedRequest]:
            try:
                for item in requests:
                    yield state.request(item)
            except Exception as e:  # surfaced to the caller after the stream
                state.error = e

        call = self._stub.EmbedStream(
            request_iterator(), timeout=self._settings.deadline(timeout),
            metadata=self._settings.metadata)
        try:
            for response in call:
                yield state.result(response, raise_errors)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None
        finally:
            call.cancel()  # no-op once finished; stops an abandoned stream
        if state.error is not None:
            raise state.error

    def server_info(self, *, timeout: Optional[float] = None) -> ServerInfo:
        """Version, backend, device, limits and presets of the server."""
        try:
            info = self._stub.GetServerInfo(
                pb.GetServerInfoRequest(),
                timeout=self._settings.deadline(timeout),
                metadata=self._settings.metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None
        return _codec.server_info_from_proto(info)

    def health(self, service: str = "", *,
               timeout: Optional[float] = None) -> HealthStatus:
        """grpc.health.v1 Check: "" is the whole server, or a service name
        such as "temb.v1.EmbeddingService".  NotFoundError for a service the
        server does not know."""
        try:
            data = self._health_check(
                _codec.encode_health_request(service),
                timeout=self._settings.deadline(timeout),
                metadata=self._settings.metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None
        return HealthStatus(_codec.decode_health_response(data))

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"temb.Client({self.target!r})"
