"""temb.local: the temb server's computation in this process, without a
network.

    import temb.local
    emb = temb.local.embed([999, 500, 1], preset="sdxl")   # numpy [3, 320]
    emb = temb.local.embed(t, preset="sd3", return_tensors="pt")  # a tensor
    parts = temb.local.embed_parts({"timestep": s, "guidance": g},
                                   preset="flux", timestep_dtype="bf16")

``embed``, ``embed_parts``, ``embed_stream``, ``server_info`` and, for an
engine with a ``model_repository``, ``condition`` and ``models`` take and
return exactly what :class:`temb.Client`'s do, and raise the same
:class:`temb.TembError` subclasses with the same messages.  The numbers are
a server's bit for bit (one with the same backend: CUDA's sincosf and the
CPU's may differ by an ulp): the native extension ``_temb_local`` is built
from the server's own service core, kernels and built-in preset catalogue
(CMake target ``temb_local_ext``), computing on the CPU, or on a GPU for
large outputs where one works (the server's ``--backend=auto``).

A call resolves its preset and options once (cached per distinct set of
arguments) and computes straight into a new numpy array: a batch of one
costs a few microseconds.  The default engine uses ``$OMP_NUM_THREADS`` CPU
threads for one large call when that is set, else every core;
:func:`configure` changes that, or use an :class:`Engine` of your own.
``temb.torch.Timesteps(..., client=temb.local)`` and
``temb.torch.patch(model, client=temb.local)`` compute through it.

Where the extension comes from: ``$TEMB_LOCAL_EXTENSION_DIR`` when set (the
directory holding ``_temb_local*.so``), else a ``_temb_local`` module inside
this package (copy the built file next to this one to install it), else, in
a checkout of the temb repository, ``<checkout>/build/python`` (where the
build puts it).  Without it, ``import temb.local`` still works and every
call raises ImportError saying how to build it; :func:`available` tells.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import (Any, Callable, Dict, Iterable, Iterator, Mapping,
                    Optional, Tuple, Union)

import grpc
import numpy as np

from temb import _codec, _request
from temb import _native as _native_extensions
from temb._proto import VERSION as _VERSION
from temb._proto.temb.v1 import temb_pb2 as pb
from temb._request import Embedding
from temb.errors import TembError, error_from_code
from temb.types import ConditioningModel, ServerInfo

__all__ = ["Engine", "available", "condition", "configure", "default_engine",
           "embed", "embed_parts", "embed_stream", "models", "server_info"]

EXTENSION_DIR_VARIABLE = _native_extensions.EXTENSION_DIR_VARIABLE
_EXTENSION = "_temb_local"
# Distinct argument sets remembered per engine before the cache starts over.
_MAX_PLANS = 512

_lock = threading.Lock()
_native: Any = None


def _extension() -> Any:
    """The loaded extension; ImportError (at every call) when there is
    none."""
    global _native
    if _native is not None:
        return _native
    with _lock:
        if _native is None:
            try:
                module = _native_extensions.load(_EXTENSION, "temb_local_ext")
            except ImportError as e:
                reason = _native_extensions.recorded_missing(
                    "NATIVE_LOCAL_MISSING") or str(e)
                raise ImportError(f"temb.local: {reason}") from None
            if module.version != _VERSION:
                raise ImportError(
                    f"temb.local: the extension {module.__file__} was built "
                    f"from temb {module.version}, this client is {_VERSION}: "
                    "rebuild it")
            module._set_error_factory(error_from_code)
            _native = module
    return _native


def available() -> bool:
    """Whether the native extension can be loaded (temb.local works)."""
    try:
        _extension()
    except ImportError:
        return False
    return True


# --- timesteps -------------------------------------------------------------

_FLOAT32 = np.dtype(np.float32)
_INT64 = np.dtype(np.int64)
# torch.Tensor and the dtypes a plan reads straight from a CPU tensor's
# memory, once torch is imported (temb.local never imports it itself).
_torch_tensor: Any = ()
_torch_float32: Any = None
_torch_int64: Any = None


def _note_torch() -> None:
    global _torch_tensor, _torch_float32, _torch_int64
    torch = sys.modules.get("torch")
    if torch is not None and _torch_tensor == ():
        _torch_float32, _torch_int64 = torch.float32, torch.int64
        _torch_tensor = torch.Tensor


def _compute(plan: Any, timesteps: Any) -> np.ndarray:
    """plan(timesteps), for anything temb.Client.embed takes as timesteps.
    float32 and int64 arrays and CPU tensors are read where they are;
    anything else is converted as the client converts it (floats to
    float32, integers to int64), and the plan converts integers to float32
    as the server converts integer_timesteps."""
    kind = type(timesteps)
    if kind is np.ndarray:
        dtype = timesteps.dtype
        if dtype is _FLOAT32 or dtype is _INT64:
            return plan(timesteps)
    elif kind is _torch_tensor:
        dtype = timesteps.dtype
        if ((dtype is _torch_float32 or dtype is _torch_int64)
                and timesteps.is_cpu and timesteps.is_contiguous()
                and not timesteps.is_neg()
                and timesteps.dim() <= _codec.MAX_TIMESTEPS_RANK):
            return plan.raw(timesteps.data_ptr(), timesteps.shape,
                            dtype is _torch_int64)
    elif timesteps is None:
        _request.embed_call()  # raises the client's error for no timesteps
    else:
        _note_torch()
    return plan(_codec.timesteps_array(timesteps))


# A stand-in for the timesteps while a call's other arguments are checked.
_NO_TIMESTEPS = np.zeros(0, np.float32)


# --- the engine ------------------------------------------------------------

def _default_cpu_threads() -> int:
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(value) if value.isdigit() else 0


class Engine:
    """One in-process service core: what a temb-server with these flags
    computes, as a :class:`temb.Client` of it would return it.

    Args:
      backend: "auto" (a working GPU for outputs of gpu_min_output_bytes
        and more, else the CPU), "cpu" or "cuda", as the server's flag.
      cpu_threads: CPU threads one large call may use (None:
        $OMP_NUM_THREADS when set, else every core).
      gpu_min_output_bytes: as the server's flag (None: its default).
      presets_file: a temb.v1.PresetCatalog text proto replacing the
        built-in catalogue, as the server's --presets_file.
      model_repository: a folder of diffusers model folders, each a
        conditioning model for :meth:`condition`, as the server's
        --model_repository (loaded on the first condition() or models()
        call, every model before it returns).
      conditioning_cache_bytes: the conditioning models' row cache, as the
        server's --conditioning_cache_bytes (None: its default).

    Thread-safe; the backend is created on first use.
    """

    def __init__(self, *, backend: str = "auto",
                 cpu_threads: Optional[int] = None,
                 gpu_min_output_bytes: Optional[int] = None,
                 presets_file: Optional[str] = None,
                 model_repository: Optional[str] = None,
                 conditioning_cache_bytes: Optional[int] = None) -> None:
        self._arguments: Dict[str, Any] = dict(
            backend=backend, cpu_threads=cpu_threads,
            gpu_min_output_bytes=gpu_min_output_bytes,
            presets_file=presets_file)
        # Only when set, so that settings (and Engine(**settings)) stay what
        # they were for an engine without conditioning models.
        if model_repository is not None:
            self._arguments["model_repository"] = model_repository
        if conditioning_cache_bytes is not None:
            self._arguments["conditioning_cache_bytes"] = \
                conditioning_cache_bytes
        self._core: Any = None
        self._conditioning: Any = None
        self._plans: Dict[Any, Tuple[Any, Any]] = {}
        self._lock = threading.Lock()

    def _get_core(self) -> Any:
        core = self._core
        if core is None:
            native = _extension()
            with self._lock:
                if self._core is None:
                    a = self._arguments
                    threads = a["cpu_threads"]
                    self._core = native.Core(
                        a["backend"],
                        (_default_cpu_threads() if threads is None
                         else int(threads)),
                        -1 if a["gpu_min_output_bytes"] is None
                        else int(a["gpu_min_output_bytes"]),
                        os.fspath(a["presets_file"] or ""))
                core = self._core
        return core

    def _get_conditioning(self) -> Any:
        conditioning = self._conditioning
        if conditioning is None:
            repository = self._arguments.get("model_repository")
            if repository is None:
                raise error_from_code(
                    grpc.StatusCode.NOT_FOUND,
                    "this engine has no conditioning models: "
                    "Engine(model_repository=DIR) or "
                    "temb.local.configure(model_repository=DIR)")
            native = _extension()
            with self._lock:
                if self._conditioning is None:
                    threads = self._arguments["cpu_threads"]
                    cache = self._arguments.get("conditioning_cache_bytes")
                    self._conditioning = native.Conditioning(
                        os.fspath(repository),
                        _default_cpu_threads() if threads is None
                        else int(threads),
                        -1 if cache is None else int(cache))
                conditioning = self._conditioning
        return conditioning

    def condition(self, model: str, timesteps: Any, guidance: Any = None,
                  pooled_projections: Any = None, outputs: Any = None,
                  return_tensors: Optional[str] = None, *,
                  request_id: Optional[str] = None,
                  timeout: Optional[float] = None, bf16_format: str = "auto",
                  **extras: Any) -> Dict[str, Any]:
        """:meth:`temb.Client.condition`, computed in this process by the
        engine's `model_repository` (``timeout`` is accepted and ignored).
        The same loader, checks, row cache and kernels as the server: the
        same bits and the same errors."""
        del timeout
        request, decoding = _request.condition_call(
            model, timesteps, guidance, pooled_projections, outputs,
            return_tensors, request_id=request_id, bf16_format=bf16_format,
            **extras)
        data = self._get_conditioning().condition(request.SerializeToString())
        return _codec.condition_result(pb.ConditionResponse.FromString(data),
                                       decoding)

    def models(self, *, timeout: Optional[float] = None
               ) -> Tuple[ConditioningModel, ...]:
        """:meth:`temb.Client.models`: the engine's conditioning models
        (none without a model_repository)."""
        del timeout
        if self._arguments.get("model_repository") is None:
            return ()
        info = pb.ServerInfo.FromString(self._get_conditioning().info())
        return _codec.server_info_from_proto(info).conditioning_models

    @property
    def backend(self) -> str:
        """"cpu" or "cuda": what this engine computes on."""
        return self._get_core().backend

    @property
    def device(self) -> str:
        return self._get_core().device

    @property
    def settings(self) -> Dict[str, Any]:
        """The arguments this engine was made (or configured) with, a copy:
        ``Engine(**engine.settings)`` computes as it does."""
        return dict(self._arguments)

    @_request.takes_embed_arguments
    def embed(self, timesteps: Any = None, *rest: Any,
              **kwargs: Any) -> Embedding:
        """:meth:`temb.Client.embed`, computed in this process (``timeout``
        is accepted and has nothing to bound).

        The first call with a set of arguments checks them as the client
        does and resolves them into a plan; later calls with equal
        arguments (``==``: ``flip_sin_to_cos=1`` reuses ``True``'s) reuse
        it and only read the timesteps."""
        # The fast path: a plan made before for these very arguments.
        if kwargs:
            kwargs.pop("timeout", None)
            key: Any = (rest, *kwargs.items())
        else:
            key = rest
        try:
            plan, finish = self._plans[key]
        except KeyError:
            return self._embed_new(timesteps, rest, kwargs, key)
        except TypeError:  # unhashable arguments (a list of frequencies)
            return self._embed_new(timesteps, rest, kwargs, None)
        out = _compute(plan, timesteps)
        return out if finish is None else finish(out)

    def embed_function(self, *, timeout: Optional[float] = None,
                       **arguments: Any) -> Callable[[Any], Embedding]:
        """``embed(timesteps, **arguments)`` as a function of the timesteps
        alone, as :meth:`temb.Client.embed_function`: the arguments are
        checked and resolved into a plan once, here (again after
        :func:`configure` replaces this engine's core); each call reads
        the timesteps where they are and computes.

        Args:
          timeout, arguments: :meth:`embed`'s keyword arguments, but
            timesteps, parts and request_id (timeout has nothing to bound).

        Returns:
          A function of 1-D, C-contiguous float32 timesteps (a numpy array,
          or a torch tensor on the CPU; anything else: call :meth:`embed`),
          returning what :meth:`embed` returns and raising what it raises;
          arguments :meth:`embed` refuses raise its error here already.
        """
        del timeout  # nothing to bound
        _request.check_function_arguments(arguments)
        plan, finish, core = self._plan(True, (), arguments)

        def embed(timesteps: Any) -> Embedding:
            nonlocal plan, finish, core
            array = type(timesteps) is np.ndarray
            if not array and timesteps.is_neg():
                # A lazily negated tensor: its memory holds -t.
                return self.embed(timesteps, **arguments)
            if self._core is not core:  # configure() since
                plan, finish, core = self._plan(True, (), arguments)
            out = (plan(timesteps) if array else
                   plan.raw(timesteps.data_ptr(), timesteps.shape, False))
            return out if finish is None else finish(out)

        return embed

    def _embed_new(self, timesteps: Any, rest: Tuple[Any, ...],
                   kwargs: Dict[str, Any], key: Any) -> Embedding:
        """embed() for arguments without a plan: checks and encodes them as
        temb.Client does, makes the plan (remembered under `key` unless
        None) and uses it; parts and request ids take the general path."""
        if kwargs.get("parts") is not None or kwargs.get("request_id"):
            return self._answer(_request.embed_call(timesteps, *rest,
                                                    **kwargs))
        plan, finish, _ = self._plan(timesteps is not None, rest, kwargs)
        if key is not None:
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            self._plans[key] = (plan, finish)
        out = _compute(plan, timesteps)
        return out if finish is None else finish(out)

    def _plan(self, with_timesteps: bool, rest: Tuple[Any, ...],
              kwargs: Dict[str, Any]) -> Tuple[Any, Any, Any]:
        """The plan for embed()'s arguments after the timesteps (checked and
        encoded as temb.Client does), the function that finishes its array
        (None: the array itself) and the core that made the plan; without
        timesteps, the client's error for that."""
        call = _request.embed_call(
            _NO_TIMESTEPS if with_timesteps else None, *rest, **kwargs)
        core = self._get_core()
        plan = core.plan(call.request.SerializeToString())
        return plan, _codec.finisher(call.decoder.decoding,
                                     plan.dtype == "bf16"), core

    def _answer(self, call: _request.EmbedCall) -> Any:
        """A whole request, parts included, answered as the server does."""
        results = self._get_core().embed_request(
            call.request.SerializeToString())
        decoding = call.decoder.decoding
        if call.decoder.names is None:
            return _codec.finish_array(results[0][1], decoding)
        return {name: _codec.finish_array(array, decoding)
                for name, array in results}

    @_request.takes_embed_parts_arguments
    def embed_parts(self, *args: Any, **kwargs: Any) -> Dict[str, Embedding]:
        """:meth:`temb.Client.embed_parts`, computed in this process."""
        return self._answer(_request.embed_parts_call(*args, **kwargs))

    def embed_stream(self, requests: Iterable[Mapping[str, Any]], *,
                     timeout: Optional[float] = None,
                     raise_errors: bool = True
                     ) -> Iterator[Union[Embedding, Dict[str, Embedding],
                                         TembError]]:
        """:meth:`temb.Client.embed_stream`: one result per item, in order; a
        rejected item raises its TembError, or is yielded in its place with
        raise_errors=False."""
        del timeout  # nothing to bound
        for item in requests:
            if "timeout" in item:
                raise TypeError("embed_stream items take no timeout: the "
                                "stream's timeout bounds them all")
            try:
                yield self.embed(**item)
            except TembError as error:
                if raise_errors:
                    raise
                yield error

    def server_info(self, *, timeout: Optional[float] = None) -> ServerInfo:
        """What a server with this engine's settings reports: version,
        backend, device, limits (max_message_bytes 0: no messages) and
        presets."""
        del timeout
        info = pb.ServerInfo.FromString(self._get_core().server_info())
        if self._arguments.get("model_repository") is not None:
            info.MergeFromString(self._get_conditioning().info())
        return _codec.server_info_from_proto(info)

    def _reset(self, arguments: Dict[str, Any]) -> None:
        with self._lock:
            self._arguments = arguments
            self._core = None
            self._conditioning = None
            self._plans = {}

    def close(self) -> None:
        """Nothing to close (for symmetry with temb.Client)."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        arguments = ", ".join(f"{k}={v!r}" for k, v in self._arguments.items()
                              if v is not None and v != "auto")
        return f"temb.local.Engine({arguments})"


_DEFAULT = Engine()


def default_engine() -> Engine:
    """The engine behind the module's functions."""
    return _DEFAULT


def engine(**arguments: Any) -> Engine:
    """The default engine when `arguments` are its own, else a new
    :class:`Engine` with them (used by temb.torch after unpickling)."""
    if dict(_DEFAULT._arguments, **arguments) == _DEFAULT._arguments:
        return _DEFAULT
    return Engine(**arguments)


def configure(*, backend: str = "auto", cpu_threads: Optional[int] = None,
              gpu_min_output_bytes: Optional[int] = None,
              presets_file: Optional[str] = None,
              model_repository: Optional[str] = None,
              conditioning_cache_bytes: Optional[int] = None) -> None:
    """Replaces the default engine's settings (see :class:`Engine`); the
    next call creates its backend (and loads its models) anew."""
    _DEFAULT._reset(Engine(
        backend=backend, cpu_threads=cpu_threads,
        gpu_min_output_bytes=gpu_min_output_bytes, presets_file=presets_file,
        model_repository=model_repository,
        conditioning_cache_bytes=conditioning_cache_bytes)._arguments)


embed = _DEFAULT.embed
embed_parts = _DEFAULT.embed_parts
embed_stream = _DEFAULT.embed_stream
server_info = _DEFAULT.server_info
condition = _DEFAULT.condition
models = _DEFAULT.models
