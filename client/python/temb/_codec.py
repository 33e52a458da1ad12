"""Conversions between Python values and temb.v1 messages.

Shared by the blocking and the asyncio clients; no I/O here.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Dict, Optional, Tuple

import grpc
import numpy as np

from temb._proto.temb.v1 import temb_pb2 as pb
from temb.errors import TembError
from temb.types import (ConditioningInput, ConditioningModel,
                        ConditioningOutput, FoldedModule, Limits, Preset,
                        RowCacheStats, ServerInfo, Spec)

_DTYPES: Dict[str, int] = {
    "fp32": pb.DTYPE_FP32, "float32": pb.DTYPE_FP32,
    "fp16": pb.DTYPE_FP16, "float16": pb.DTYPE_FP16, "half": pb.DTYPE_FP16,
    "bf16": pb.DTYPE_BF16, "bfloat16": pb.DTYPE_BF16,
    "fp64": pb.DTYPE_FP64, "float64": pb.DTYPE_FP64, "double": pb.DTYPE_FP64,
}
_DTYPE_NAMES = {pb.DTYPE_FP32: "fp32", pb.DTYPE_FP16: "fp16",
                pb.DTYPE_BF16: "bf16", pb.DTYPE_FP64: "fp64"}
# Wire element types (little-endian); bf16 travels as its raw bits.
_WIRE: Dict[int, np.dtype] = {
    pb.DTYPE_FP32: np.dtype("<f4"), pb.DTYPE_FP16: np.dtype("<f2"),
    pb.DTYPE_BF16: np.dtype("<u2"), pb.DTYPE_FP64: np.dtype("<f8")}
# The same in this machine's byte order (what results are returned in).
_NATIVE = {k: v.newbyteorder("=") for k, v in _WIRE.items()}
_LAYOUTS = {"halves": pb.LAYOUT_HALVES, "interleaved": pb.LAYOUT_INTERLEAVED}
_LAYOUT_NAMES = {v: k for k, v in _LAYOUTS.items()}
_EXPONENT_ORDERS = {"divide_last": pb.EXPONENT_ORDER_DIVIDE_LAST,
                    "slope_first": pb.EXPONENT_ORDER_SLOPE_FIRST}
_EXPONENT_ORDER_NAMES = {v: k for k, v in _EXPONENT_ORDERS.items()}
_PRECISIONS = {"fp32": pb.PRECISION_FP32, "float32": pb.PRECISION_FP32,
               "fp64": pb.PRECISION_FP64, "float64": pb.PRECISION_FP64}
_PRECISION_NAMES = {pb.PRECISION_FP32: "fp32", pb.PRECISION_FP64: "fp64"}
# timestep_dtype takes the dtype names; the server refuses fp64 with a
# message saying why.
_ENUMS = {"dtype": _DTYPES, "timestep_dtype": _DTYPES, "layout": _LAYOUTS,
          "exponent_order": _EXPONENT_ORDERS, "precision": _PRECISIONS}
_BF16_FORMATS = ("auto", "float32", "bits", "ml_dtypes")
_RETURN_TENSORS = ("np", "pt")

# The optional EmbeddingSpec fields, by their (diffusers) keyword names.
_SPEC_FIELDS = ("max_period", "flip_sin_to_cos", "downscale_freq_shift",
                "scale", "time_factor", "repeat_only")


@dataclasses.dataclass(frozen=True)
class Decoding:
    """How to turn one response tensor into the caller's array type."""

    return_tensors: str = "np"
    bf16_format: str = "auto"


def _dtype_name(value: Any) -> Any:
    """"bfloat16" for torch.bfloat16, "float16" for numpy.float16 or
    numpy.dtype("float16"); other values unchanged."""
    if isinstance(value, str):
        return value
    if type(value).__module__ == "torch" and str(value).startswith("torch."):
        return str(value)[len("torch."):]  # a torch.dtype
    try:
        return np.dtype(value).name
    except (TypeError, ValueError):
        return value


def _choice(name: str, value: Any, allowed: Any) -> Any:
    """allowed[value] for a dict, value itself for a tuple; else ValueError."""
    key = value.lower() if isinstance(value, str) else value
    if isinstance(key, str) and key in allowed:
        return allowed[key] if isinstance(allowed, dict) else key
    raise ValueError(
        f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def _is_torch_tensor(value: Any) -> bool:
    # Checked by module name so that torch is imported only by its users.
    return (type(value).__module__.startswith("torch")
            and hasattr(value, "detach"))


_FLOAT32 = np.dtype(np.float32)
# The rank limit of EmbedRequest.timesteps_shape.
MAX_TIMESTEPS_RANK = 5


def timesteps_array(timesteps: Any) -> np.ndarray:
    """The timesteps as a float32 or int64 array of their own shape.

    Floating values become float32, as in diffusers (``timesteps.float()``);
    integer values stay integers (the server converts them, exact to 2^24).
    """
    if type(timesteps) is np.ndarray and timesteps.dtype == _FLOAT32:
        array = timesteps  # the common case, checked for rank below
    elif _is_torch_tensor(timesteps):
        import torch
        # A lazily negated view (torch._neg_view) holds -t in its memory,
        # which numpy() would refuse: make the values real first.
        tensor = timesteps.detach().resolve_neg()
        if tensor.dtype == torch.float32 and tensor.device.type == "cpu":
            array = tensor.numpy()  # the common case: shares the memory
        elif tensor.is_complex() or tensor.dtype == torch.bool:
            raise TypeError(
                f"timesteps must be real numbers, got {tensor.dtype}")
        elif tensor.device.type == "meta":
            raise ValueError("timesteps on the meta device have no values")
        else:
            target = (torch.float32 if tensor.is_floating_point()
                      else torch.int64)
            array = tensor.to(device="cpu", dtype=target).numpy()
    else:
        array = np.asarray(timesteps)
        if array.dtype.kind == "O":
            # A Python list mixing large ints and floats; let float32 decide.
            array = array.astype(np.float64)
    if array.ndim > MAX_TIMESTEPS_RANK:
        raise ValueError(f"timesteps may have at most {MAX_TIMESTEPS_RANK} "
                         f"dimensions, got shape {array.shape}")
    kind = array.dtype.kind
    if array.dtype == _FLOAT32:
        return array
    if kind == "f":
        # Values beyond float32 become inf, which the server rejects by index.
        with np.errstate(over="ignore"):
            return array.astype(np.float32, copy=False)
    if kind in "iu":
        if kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
            raise ValueError("integer timesteps must fit in int64")
        return array.astype(np.int64, copy=False)
    raise TypeError(f"timesteps must be real numbers, got dtype {array.dtype}")


def encode_timesteps(message: Any, timesteps: Any) -> Tuple[int, ...]:
    """Sets the timesteps of `message` (an EmbedRequest or EmbedPart):
    integer values as integers, and timesteps_shape for 2 to 5 dimensions.

    Returns the leading shape of the embedding (the embedding's shape
    without its last extent, dim): (N,) for a 1-D input, (1,) for a scalar
    (a batch of one), the input's shape otherwise.
    """
    array = timesteps_array(timesteps)
    flat = array.reshape(-1)
    if array.dtype == np.int64:
        message.integer_timesteps.extend(flat.tolist())
    else:
        message.timesteps.extend(flat.tolist())
    if array.ndim > 1:
        message.timesteps_shape.extend(array.shape)
        return tuple(array.shape)
    return (flat.size,)


def frequencies_list(frequencies: Any) -> list:
    """A 1-D sequence (list, numpy array, torch tensor) of frequencies as
    Python floats (they travel as doubles)."""
    if _is_torch_tensor(frequencies):
        frequencies = frequencies.detach().to("cpu").double().numpy()
    array = np.asarray(frequencies, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"frequencies must be 1-D, got shape {array.shape}")
    return array.tolist()


def enum_value(field: str, name: Any) -> Any:
    """The temb.v1 enum number of a "dtype", "timestep_dtype", "layout",
    "exponent_order" or "precision" name; the dtypes also take torch and
    numpy dtypes."""
    if field in ("dtype", "timestep_dtype"):
        name = _dtype_name(name)
    return _choice(field, name, _ENUMS[field])


@functools.lru_cache(maxsize=64)
def make_decoding(return_tensors: str, bf16_format: str) -> Decoding:
    _choice("return_tensors", return_tensors, _RETURN_TENSORS)
    _choice("bf16_format", bf16_format, _BF16_FORMATS)
    return Decoding(return_tensors, bf16_format)


def _import_torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError('return_tensors="pt" needs PyTorch, which is not '
                          "installed: pip install torch") from e
    return torch


def _bf16_bits_as_float32(bits: np.ndarray) -> np.ndarray:
    # A bfloat16 is the top half of a float32: widening is exact.
    return (bits.astype(np.uint32) << 16).view(np.float32)


def decode_tensor(tensor: pb.Tensor, decoding: Decoding,
                  leading_shape: Optional[Tuple[int, ...]] = None) -> Any:
    """The response tensor as a writable numpy array or torch tensor.

    `leading_shape`, when given, is the shape the tensor must have before
    its last extent (dim): the request's timesteps shape.

    bf16 results, with numpy: "auto" gives ``ml_dtypes.bfloat16`` when
    ml_dtypes is installed and float32 holding the exact bf16 values
    otherwise; "float32" and "ml_dtypes" force one of the two; "bits" gives
    the raw uint16 bit patterns (``.view(ml_dtypes.bfloat16)``-able).  With
    torch, bf16 is ``torch.bfloat16`` (bf16_format is ignored).
    """
    wire = _WIRE.get(tensor.dtype)
    if wire is None:
        raise TembError(grpc.StatusCode.DATA_LOSS,
                        f"response has unknown dtype {tensor.dtype}")
    shape = tuple(tensor.shape)  # a repeated int64 field: Python ints
    count = math.prod(shape) if shape else 0
    if (len(shape) < 2 or count * wire.itemsize != len(tensor.data)
            or (leading_shape is not None
                and shape[:-1] != tuple(leading_shape))):
        expected = ("" if leading_shape is None else
                    f" (expected {list(leading_shape)} + [dim])")
        raise TembError(grpc.StatusCode.DATA_LOSS,
                        f"response tensor of shape {list(shape)}{expected} "
                        f"and dtype {_DTYPE_NAMES[tensor.dtype]} carries "
                        f"{len(tensor.data)} bytes")
    # Copy once into native byte order so that the result is writable.
    array = np.frombuffer(tensor.data, dtype=wire).astype(
        _NATIVE[tensor.dtype], copy=True).reshape(shape)
    finish = finisher(decoding, tensor.dtype == pb.DTYPE_BF16)
    return array if finish is None else finish(array)


def finish_array(array: np.ndarray, decoding: Decoding) -> Any:
    """A decoded array (bf16 as uint16 bits) as embed() returns it."""
    finish = finisher(decoding, array.dtype == np.uint16)
    return array if finish is None else finish(array)


def finisher(decoding: Decoding, bf16: bool
             ) -> Optional[Callable[[np.ndarray], Any]]:
    """What turns a decoded array (bf16 as uint16 bits) into what embed()
    returns, or None for the array itself (see :func:`decode_tensor`)."""
    if decoding.return_tensors == "pt":
        torch = _import_torch()
        if bf16:
            return lambda a: torch.from_numpy(a.view(np.int16)).view(
                torch.bfloat16)
        return torch.from_numpy
    if not bf16 or decoding.bf16_format == "bits":
        return None
    if decoding.bf16_format in ("auto", "ml_dtypes"):
        try:
            import ml_dtypes
            bfloat16 = ml_dtypes.bfloat16
            return lambda a: a.view(bfloat16)
        except ImportError:
            if decoding.bf16_format == "ml_dtypes":
                raise ImportError('bf16_format="ml_dtypes" needs ml_dtypes: '
                                  'pip install "temb[bf16]"') from None
    return _bf16_bits_as_float32


def _spec_from_proto(spec: pb.EmbeddingSpec) -> Spec:
    values = {name: getattr(spec, name) if spec.HasField(name) else None
              for name in ("dim",) + _SPEC_FIELDS}
    law = (spec.log_spaced_frequencies
           if spec.HasField("log_spaced_frequencies") else None)
    return Spec(**values,
                layout=_LAYOUT_NAMES.get(spec.layout),
                exponent_order=_EXPONENT_ORDER_NAMES.get(spec.exponent_order),
                precision=_PRECISION_NAMES.get(spec.precision),
                timestep_dtype=_DTYPE_NAMES.get(spec.timestep_dtype),
                frequencies=tuple(spec.frequencies) or None,
                log_spaced_frequencies=None if law is None else
                (law.min_frequency, law.max_frequency))


_MODEL_STATES = {pb.MODEL_STATE_LOADING: "loading",
                 pb.MODEL_STATE_READY: "ready",
                 pb.MODEL_STATE_FAILED: "failed",
                 pb.MODEL_STATE_UNLOADED: "unloaded"}


def _conditioning_model_from_proto(model: pb.ConditioningModel
                                   ) -> ConditioningModel:
    return ConditioningModel(
        name=model.name, state=_MODEL_STATES.get(model.state, "unknown"),
        message=model.message, family=model.family,
        dtype=_DTYPE_NAMES.get(model.dtype), width=model.width,
        weight_bytes=model.weight_bytes,
        weight_fingerprints=dict(model.weight_fingerprints),
        inputs=tuple(ConditioningInput(i.name, i.width, i.help, i.stands_for,
                                       i.instead_of, i.module, i.argument,
                                       i.in_model_dtype)
                     for i in model.inputs),
        outputs=tuple(ConditioningOutput(o.name, _DTYPE_NAMES.get(o.dtype),
                                         tuple(o.row_shape), o.row_bytes,
                                         o.layout, o.replaces,
                                         o.replaced_kind, tuple(o.blocks),
                                         o.input_module, o.embedding)
                      for o in model.outputs),
        folded_modules=tuple(FoldedModule(f.module, f.kind)
                             for f in model.folded_modules),
        class_name=model.class_name, config=dict(model.config),
        embedder_results=tuple(model.embedder_results))


def server_info_from_proto(info: pb.ServerInfo) -> ServerInfo:
    limits = info.limits
    cache = info.conditioning_cache
    return ServerInfo(
        version=info.version, backend=info.backend, device=info.device,
        limits=Limits(limits.max_dim, limits.max_batch,
                      limits.max_output_bytes, limits.max_message_bytes,
                      limits.max_request_bytes),
        presets=tuple(
            Preset(p.name, p.description, _spec_from_proto(p.spec),
                   p.dim_overridable, _DTYPE_NAMES.get(p.default_dtype),
                   tuple((part.name, part.preset) for part in p.parts))
            for p in info.presets),
        conditioning_models=tuple(_conditioning_model_from_proto(m)
                                  for m in info.conditioning_models),
        conditioning_cache=RowCacheStats(
            cache.hits, cache.misses, cache.entries, cache.bytes,
            cache.evictions, cache.capacity_bytes))


# Condition: inputs travel as tensors of their own dtype, decoded exactly by
# the server; outputs come back in the model's dtype, and the per-token
# "index" as int64.
_INPUT_WIRE = {np.dtype(np.float32): pb.DTYPE_FP32,
               np.dtype(np.float16): pb.DTYPE_FP16}
_INT64_WIRE = np.dtype("<i8")
# Integers become float32 only where that is exact.
_EXACT_INTEGER_LIMIT = 1 << 24


def condition_input(name: str, value: Any) -> pb.NamedTensor:
    """One input of a Condition request, of the value's own shape (a scalar
    is one value).

    float32 and float16 values travel as they are, bfloat16 ones (a torch
    tensor, or an ml_dtypes array) as their bits: the server converts them
    exactly.  Other floating values become float32, as diffusers'
    ``.float()`` would make them (as :meth:`temb.Client.embed` does);
    integers too, where that is exact (|value| <= 2^24), else ValueError.
    """
    bf16 = None
    if _is_torch_tensor(value):
        import torch
        tensor = value.detach().resolve_neg()
        if tensor.device.type == "meta":
            raise ValueError(f"{name}: a tensor on the meta device has no "
                             "values")
        tensor = tensor.cpu()
        if tensor.dtype == torch.bfloat16:
            bf16 = tensor.contiguous().view(torch.int16).numpy().view(
                np.uint16)
            array = bf16
        elif tensor.is_complex() or tensor.dtype == torch.bool:
            raise TypeError(f"{name} must be real numbers, got {tensor.dtype}")
        else:
            array = tensor.numpy()
    else:
        array = np.asarray(value)
        if array.dtype.name == "bfloat16":  # ml_dtypes
            bf16 = array.view(np.uint16)
            array = bf16
        elif array.dtype.kind == "O":
            array = array.astype(np.float64)
    message = pb.NamedTensor(name=name)
    tensor_message = message.tensor
    tensor_message.shape.extend(array.shape if array.ndim else (1,))
    if bf16 is not None:
        tensor_message.dtype = pb.DTYPE_BF16
        tensor_message.data = np.ascontiguousarray(
            bf16, dtype=np.dtype("<u2")).tobytes()
        return message
    kind = array.dtype.kind
    if kind in "iub":
        if kind == "b":
            raise TypeError(f"{name} must be numbers, got booleans")
        if array.size and np.abs(array.astype(np.float64)).max() > \
                _EXACT_INTEGER_LIMIT:
            raise ValueError(f"{name}: integer values beyond 2^24 are not "
                             "exactly float32: pass floating values")
        array = array.astype(np.float32)
    elif kind != "f":
        raise TypeError(f"{name} must be real numbers, got dtype "
                        f"{array.dtype}")
    wire = _INPUT_WIRE.get(array.dtype.newbyteorder("="))
    if wire is None:
        with np.errstate(over="ignore"):
            array = array.astype(np.float32)
        wire = pb.DTYPE_FP32
    tensor_message.dtype = wire
    little = array.dtype.newbyteorder("<")
    tensor_message.data = np.ascontiguousarray(array, dtype=little).tobytes()
    return message


def decode_condition_output(tensor: pb.Tensor, decoding: Decoding) -> Any:
    """One output of a Condition answer as a writable array (bf16 as for
    embed(), see :func:`decode_tensor`; the index as int64)."""
    wire = _INT64_WIRE if tensor.dtype == pb.DTYPE_INT64 else \
        _WIRE.get(tensor.dtype)
    if wire is None:
        raise TembError(grpc.StatusCode.DATA_LOSS,
                        f"response has unknown dtype {tensor.dtype}")
    shape = tuple(tensor.shape)
    count = math.prod(shape) if shape else 0
    if not shape or count * wire.itemsize != len(tensor.data):
        raise TembError(grpc.StatusCode.DATA_LOSS,
                        f"response tensor of shape {list(shape)} carries "
                        f"{len(tensor.data)} bytes")
    array = np.frombuffer(tensor.data, dtype=wire).astype(
        wire.newbyteorder("="), copy=True).reshape(shape)
    finish = finisher(decoding, tensor.dtype == pb.DTYPE_BF16)
    return array if finish is None else finish(array)


def condition_request(model: str, inputs: Dict[str, Any],
                      outputs: Optional[Any], request_id: Optional[str]
                      ) -> pb.ConditionRequest:
    """A ConditionRequest; inputs that are None are left out."""
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a model's name, got {model!r}")
    request = pb.ConditionRequest(model=model, request_id=request_id or "")
    for name, value in inputs.items():
        if value is not None:
            request.inputs.append(condition_input(name, value))
    if outputs is not None:
        if isinstance(outputs, str):
            outputs = [outputs]
        request.outputs.extend(outputs)
    return request


def explain_condition_error(error: TembError, request: pb.ConditionRequest
                            ) -> TembError:
    """gRPC's refusal of a message over the server's receive limit names no
    field: say which inputs made the request that large, and what to do."""
    if (error.code != grpc.StatusCode.RESOURCE_EXHAUSTED
            or "larger than max" not in error.details):
        return error
    sizes = ", ".join(f"{i.name} {list(i.tensor.shape)}: "
                      f"{len(i.tensor.data)} bytes" for i in request.inputs)
    return type(error)(
        error.code,
        f"{error.details}: the request's inputs ({sizes}) are over the "
        "server's request limit (server_info().limits.max_request_bytes); "
        "give pooled projections shared by every row as one row [P], or "
        "split the timesteps over several calls", error.request_id)


def condition_result(response: pb.ConditionResponse, decoding: Decoding
                     ) -> Dict[str, Any]:
    return {output.name: decode_condition_output(output.tensor, decoding)
            for output in response.outputs}


# grpc.health.v1 has two one-field messages; they are encoded by hand so the
# client needs neither grpcio-health-checking nor a second copy of its
# descriptors (which would clash with that package's in the protobuf pool).
# Their field numbers (grpc/health/v1/health.proto; the tests compare them
# with its descriptors):
HEALTH_SERVICE_FIELD = 1  # HealthCheckRequest.service, a string
HEALTH_STATUS_FIELD = 1  # HealthCheckResponse.status, an enum
_VARINT, _LENGTH_DELIMITED = 0, 2  # wire types


def encode_health_request(service: str) -> bytes:
    data = service.encode("utf-8")
    if not data:
        return b""
    key = HEALTH_SERVICE_FIELD << 3 | _LENGTH_DELIMITED
    return _varint(key) + _varint(len(data)) + data


def decode_health_response(data: bytes) -> int:
    """The `status` field of a HealthCheckResponse."""
    status, pos = 0, 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        wire_type = key & 7
        if wire_type == _VARINT:
            value, pos = _read_varint(data, pos)
            if key >> 3 == HEALTH_STATUS_FIELD:
                status = value
        elif wire_type == _LENGTH_DELIMITED:
            length, pos = _read_varint(data, pos)
            pos += length
        else:
            raise TembError(grpc.StatusCode.DATA_LOSS,
                            "malformed grpc.health.v1 response")
    return status


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise TembError(grpc.StatusCode.DATA_LOSS,
                            "malformed grpc.health.v1 response")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos
