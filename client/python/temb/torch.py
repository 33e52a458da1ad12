"""PyTorch integration: diffusers' `Timesteps` module computed by temb.

    import temb, temb.torch
    client = temb.Client("localhost:50051")
    temb.torch.patch(transformer, client=client)   # every Timesteps module
    # or one module by hand:
    unet.time_proj = temb.torch.Timesteps(320, True, 0, client=client)
    # or in-process, without a server (temb.local: the same numbers):
    temb.torch.patch(transformer, client=temb.local)
    # or the transformer's whole time conditioning, its weights released:
    temb.torch.offload_conditioning(transformer, client=client,
                                    model="qwen-image",
                                    schedule=pipe.scheduler.timesteps)

The embedding is the registered custom op ``torch.ops.temb.timestep_embedding``
(with a fake/meta implementation; PyTorch 2.4 or later), so patched models
run under ``torch.compile(fullgraph=True)`` and meta tensors get meta
results.  Modules
survive ``copy.deepcopy`` (the copy shares the connection) and ``pickle``
(the connection is not pickled: its settings are, and the unpickled module
opens an equal client on first use, in whatever process it lands).

Importing this module needs PyTorch (``pip install torch``).
"""

from __future__ import annotations

import copy
import pickle
import threading
import uuid
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "temb.torch needs PyTorch, which is not installed: pip install "
        "torch (the package's [torch] extra pulls the same)") from e

from temb import local
from temb.client import Client

__all__ = ["OffloadedConditioning", "Timesteps", "conditioning_modules",
           "offload_conditioning", "patch", "timestep_embedding"]

_DEFAULT_MAX_PERIOD = 10000.0


# --- connections by key ----------------------------------------------------
#
# A custom op takes tensors and plain values only, so modules name their
# client by a key: the live client of that key when this process has one
# (a caller's shared client, held weakly: the modules hold it), else one
# opened here from the settings registered under the key and kept for the
# life of the process (after unpickling, or in a multiprocessing worker).

_LOCK = threading.Lock()
_LIVE: weakref.WeakValueDictionary[str, Client] = weakref.WeakValueDictionary()
_OPENED: Dict[str, Client] = {}
_SETTINGS: Dict[str, Dict[str, Any]] = {}
_KEY_ATTRIBUTE = "_temb_torch_key"


def _as_client(client: Any) -> Any:
    """`client` itself (a temb.Client or temb.local.Engine), or the default
    engine for the module temb.local; TypeError for anything else."""
    if client is local:
        return local.default_engine()
    if not isinstance(client, (Client, local.Engine)):
        raise TypeError("temb.torch needs a blocking temb.Client or "
                        "temb.local, got "
                        f"{type(client).__module__}.{type(client).__name__}")
    return client


def _settings_of(client: Any) -> Dict[str, Any]:
    """What opens an equal client (or temb.local engine) elsewhere."""
    if isinstance(client, Client):
        return client.settings
    return {"local": client.settings}


def _open(settings: Dict[str, Any]) -> Any:
    if "local" in settings:
        return local.engine(**settings["local"])
    return Client(**settings)


def _key_of(client: Any) -> str:
    """Registers a live client; the same client always gets the same key."""
    with _LOCK:
        key = getattr(client, _KEY_ATTRIBUTE, None)
        if key is None:
            key = uuid.uuid4().hex
            setattr(client, _KEY_ATTRIBUTE, key)
        _LIVE[key] = client
        _SETTINGS[key] = _settings_of(client)
    return key


def _register_settings(key: str, settings: Dict[str, Any]) -> None:
    with _LOCK:
        _SETTINGS.setdefault(key, dict(settings))


def _client_for(key: str) -> Client:
    with _LOCK:
        client = _LIVE.get(key) or _OPENED.get(key)
        if client is None:
            settings = _SETTINGS.get(key)
            if settings is None:
                raise RuntimeError(
                    f"no temb client is registered under {key!r}: the op is "
                    "called by temb.torch.Timesteps modules")
            client = _OPENED[key] = _open(settings)
            setattr(client, _KEY_ATTRIBUTE, key)
            _LIVE[key] = client
        return client


def _drop(key: str) -> None:
    """Forgets the client opened from settings under `key` (closing it)."""
    with _LOCK:
        client = _OPENED.pop(key, None)
        if client is not None and _LIVE.get(key) is client:
            del _LIVE[key]  # a caller's client under this key stays
    if client is not None:
        client.close()


# --- the op ----------------------------------------------------------------

def _leading_shape(timesteps: torch.Tensor) -> Tuple[int, ...]:
    # A scalar is a batch of one, as in temb.Client.embed.
    return tuple(timesteps.shape) if timesteps.dim() else (1,)


def _embed(timesteps: torch.Tensor, client_key: str, num_channels: int,
           flip_sin_to_cos: bool, downscale_freq_shift: float, scale: float,
           max_period: float, precision: str,
           timeout: Optional[float]) -> torch.Tensor:
    """diffusers' ``get_timestep_embedding(timesteps, num_channels,
    flip_sin_to_cos, downscale_freq_shift, scale, max_period)``, computed by
    the temb server the key names: float32 of shape timesteps.shape +
    [num_channels], on the timesteps' device.  precision: "fp32" | "fp64";
    timeout None: the client's."""
    client = _client_for(client_key)
    embedding = client.embed(
        timesteps, dim=num_channels, flip_sin_to_cos=flip_sin_to_cos,
        downscale_freq_shift=downscale_freq_shift, scale=scale,
        max_period=max_period, precision=precision, dtype="fp32",
        timeout=timeout, return_tensors="pt")
    return embedding.to(timesteps.device)


def _fake(timesteps, client_key, num_channels, flip_sin_to_cos,
          downscale_freq_shift, scale, max_period, precision, timeout):
    return timesteps.new_empty((*_leading_shape(timesteps), num_channels),
                               dtype=torch.float32)


def _direct_call(client: Any, num_channels: int, flip_sin_to_cos: bool,
                 downscale_freq_shift: float, scale: float, max_period: float,
                 precision: str, timeout: Optional[float]
                 ) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
    """What a module's plain eager call of 1-D float32 CPU timesteps does:
    the client's (or engine's) embed_function for _embed's request, made
    once (the engine's plan, or the request head encoded once); None for a
    client without one (grpcio: _embed then).  Inside a denoising loop
    every Python step between two calls costs several times what it does
    in a tight loop, so this leaves out embed()'s argument handling as well
    as the op."""
    return client.embed_function(
        dim=num_channels, flip_sin_to_cos=flip_sin_to_cos,
        downscale_freq_shift=downscale_freq_shift, scale=scale,
        max_period=max_period, precision=precision, dtype="fp32",
        return_tensors="pt", timeout=timeout)


if hasattr(torch.library, "custom_op"):  # PyTorch 2.4 and later
    timestep_embedding = torch.library.custom_op(
        "temb::timestep_embedding", _embed, mutates_args=())
    timestep_embedding.register_fake(_fake)
else:  # pragma: no cover - older PyTorch: eager only
    # A plain function stands in for the op (a CustomOpDef above).
    def timestep_embedding(timesteps, *args):  # type: ignore[misc]
        if timesteps.device.type == "meta":
            return _fake(timesteps, *args)
        return _embed(timesteps, *args)


# What tells whether a Python mode watches the dispatcher (None: a PyTorch
# without it).
_len_torch_dispatch_stack: Optional[Callable[[], int]]
try:
    from torch._C import _len_torch_dispatch_stack, _len_torch_function_stack
except ImportError:  # pragma: no cover - a PyTorch without them: always the op
    _len_torch_dispatch_stack = None


def _plain_eager_call(timesteps: torch.Tensor) -> bool:
    """Whether a call can skip the registered op: a plain tensor with data,
    called eagerly, with nothing watching the dispatcher.  Compiling,
    tracing (jit, export, make_fx), fake and functional tensors and every
    Python dispatch or function mode still go through the op, which is what
    makes those work; a plain call saves the op's dispatch (~10 us).  The
    mode stacks are asked for their depth in C: inside a denoising loop the
    Python helpers that list them cost several microseconds."""
    # is_compiling() first: Dynamo folds it to True and must not trace the
    # C calls after it.
    if (_len_torch_dispatch_stack is None
            or type(timesteps) is not torch.Tensor
            or torch.compiler.is_compiling() or timesteps.is_meta):
        return False
    return (not torch.jit.is_tracing()
            and _len_torch_dispatch_stack() == 0
            and _len_torch_function_stack() == 0)


# --- the module ------------------------------------------------------------

class Timesteps(torch.nn.Module):
    """diffusers.models.embeddings.Timesteps, evaluated by a temb server.

    The first four arguments are diffusers'.  Exactly one of `client` (a
    shared :class:`temb.Client`, the better choice for many modules; or
    ``temb.local`` or a ``temb.local.Engine``: computed in this process, the
    same numbers without a server) or `target` (modules with the same target
    then share one client opened on first use) must be given.
    `max_period` (default 10000, as diffusers' get_timestep_embedding) and
    `precision` ("fp32" | "fp64") are passed through.

    forward(timesteps) takes a tensor of rank 0 to 5 (or anything
    :meth:`temb.Client.embed` accepts) and returns float32 of shape
    timesteps.shape + [num_channels] ([1, num_channels] for a scalar) on
    the timesteps' device.  The module has no parameters or buffers, like
    diffusers'.  Timesteps in bf16/fp16 are widened exactly, as diffusers'
    ``timesteps.float()``.
    """

    def __init__(self, num_channels: int, flip_sin_to_cos: bool,
                 downscale_freq_shift: float, scale: float = 1, *,
                 client: Any = None,
                 target: Optional[str] = None,
                 max_period: Optional[float] = None,
                 precision: Optional[str] = None,
                 timeout: Optional[float] = None) -> None:
        super().__init__()
        if (client is None) == (target is None):
            raise ValueError(
                "Timesteps needs exactly one of client= or target=")
        if precision not in (None, "fp32", "fp64"):
            raise ValueError(
                f'precision must be "fp32" or "fp64", got {precision!r}')
        self.num_channels = int(num_channels)
        self.flip_sin_to_cos = bool(flip_sin_to_cos)
        self.downscale_freq_shift = float(downscale_freq_shift)
        self.scale = scale
        self.max_period = max_period
        self.precision = precision
        self.timeout = timeout
        # (client, the op's arguments, _direct_call for them): rebuilt for
        # another client (one re-opened after close()) and after a
        # _CALL_ATTRIBUTES change.  The call follows its client's own
        # changes (a forked child's move to grpcio, temb.local.configure).
        self._direct: Optional[Tuple[Any, Tuple[Any, ...], Any]] = None
        if client is not None:
            client = _as_client(client)
            self._client_key = _key_of(client)
            self._client_settings = _settings_of(client)
            self._client = client  # keeps the caller's client alive
        else:
            # One client per target among modules made with target=.
            assert target is not None  # exactly one of client and target
            self._client_settings = {"target": target}
            self._client_key = "target:" + target
            _register_settings(self._client_key, self._client_settings)
            self._client = None

    @property
    def client(self) -> Client:
        """The client this module calls (opened now if need be)."""
        if self._client is None:
            return _client_for(self._client_key)
        return self._client

    # The attributes a call depends on: setting one drops the direct call
    # built from them.
    _CALL_ATTRIBUTES = frozenset((
        "num_channels", "flip_sin_to_cos", "downscale_freq_shift", "scale",
        "max_period", "precision", "timeout"))

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in self._CALL_ATTRIBUTES:
            self.__dict__["_direct"] = None

    def _arguments(self) -> Tuple[Any, ...]:
        """The op's arguments after the client key."""
        return (self.num_channels, self.flip_sin_to_cos,
                self.downscale_freq_shift, float(self.scale),
                float(_DEFAULT_MAX_PERIOD if self.max_period is None
                      else self.max_period),
                self.precision or "fp32",
                None if self.timeout is None else float(self.timeout))

    def forward(self, timesteps: Any) -> torch.Tensor:
        if not isinstance(timesteps, torch.Tensor):
            timesteps = torch.as_tensor(timesteps)
        if not _plain_eager_call(timesteps):
            return timestep_embedding(timesteps, self._client_key,
                                      *self._arguments())
        if (timesteps.dtype == torch.float32 and timesteps.dim() == 1
                and timesteps.is_cpu and timesteps.is_contiguous()):
            client = self._client
            if client is None:
                client = _client_for(self._client_key)
            direct = self._direct
            if direct is None or direct[0] is not client:
                arguments = self._arguments()
                direct = self._direct = (
                    client, arguments, _direct_call(client, *arguments))
            if direct[2] is not None:
                return direct[2](timesteps)
        return _embed(timesteps, self._client_key, *self._arguments())

    def close(self) -> None:
        """Closes the client opened for target= (or after unpickling); a
        caller's client is the caller's to close.  The next call opens a
        new one."""
        _drop(self._client_key)

    # copy.deepcopy (EMA copies): the copy shares the live client.
    def __deepcopy__(self, memo: Dict[int, Any]) -> Timesteps:
        clone = self.__class__.__new__(self.__class__)
        memo[id(self)] = clone
        state = self.__dict__.copy()
        shared = {name: state.pop(name)
                  for name in ("_client", "_client_settings", "_direct")}
        clone.__dict__.update(copy.deepcopy(state, memo))
        clone.__dict__.update(shared)
        return clone

    # pickle: the client's settings travel, not its connection.
    def __getstate__(self) -> Dict[str, Any]:
        try:
            pickle.dumps(self._client_settings)
        except Exception as e:
            raise TypeError(
                "this temb.torch.Timesteps cannot be pickled: its client's "
                "settings cannot (grpc.ChannelCredentials are not picklable: "
                "give the client tls=temb.TlsConfig(...) instead)") from e
        state = self.__dict__.copy()
        state["_client"] = None
        state["_direct"] = None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        state.setdefault("_direct", None)
        self.__dict__.update(state)
        _register_settings(self._client_key, self._client_settings)

    def extra_repr(self) -> str:
        target = ("temb.local" if "local" in self._client_settings
                  else self._client_settings.get("target"))
        return (f"num_channels={self.num_channels}, "
                f"flip_sin_to_cos={self.flip_sin_to_cos}, "
                f"downscale_freq_shift={self.downscale_freq_shift}, "
                f"scale={self.scale}, target={target!r}")


# --- patching diffusers models ----------------------------------------------

def _replaceable(module: torch.nn.Module) -> Optional[Dict[str, Any]]:
    """The Timesteps arguments of a diffusers sinusoid module this module
    can stand in for exactly, or None."""
    # diffusers' sinusoid modules keep get_timestep_embedding's arguments as
    # attributes, and a max_period other than 10000 as time_theta; their
    # forward calls it with exactly those.
    cls = type(module)
    names = getattr(getattr(cls.forward, "__code__", None), "co_names", ())
    if not (cls.__module__.startswith("diffusers.models.")
            and "get_timestep_embedding" in names
            and all(hasattr(module, attribute) for attribute in (
                "num_channels", "flip_sin_to_cos", "downscale_freq_shift",
                "scale"))):
        return None
    extra: Dict[str, Any] = {}
    if hasattr(module, "time_theta"):
        # A float attribute, which torch types as a submodule or a tensor.
        extra["max_period"] = float(module.time_theta)  # type: ignore[arg-type]
    return dict(num_channels=module.num_channels,
                flip_sin_to_cos=module.flip_sin_to_cos,
                downscale_freq_shift=module.downscale_freq_shift,
                scale=module.scale, **extra)


def patch(model: torch.nn.Module, client: Any = None, *,
          target: Optional[str] = None, timeout: Optional[float] = None,
          precision: Optional[str] = None) -> List[str]:
    """Replaces, in place, every diffusers sinusoid module of `model`
    (``Timesteps``, and those that add a max_period such as Bria's
    ``BriaTimesteps``) with a :class:`Timesteps` of the same convention
    (num_channels, flip_sin_to_cos, downscale_freq_shift, scale), served
    through `client` (or a client for `target`; ``client=temb.local``
    computes in this process).

    A module reachable under several names (Flux's time_proj serves timestep
    and guidance) is replaced by one module everywhere.  Returns the
    qualified names replaced, e.g. ["time_text_embed.time_proj"]; `model`
    itself is never replaced.  Other sinusoid classes (SkyReels-V2's float64
    one, LongCat's, Stable Audio's Fourier features) are left alone.
    """
    if (client is None) == (target is None):
        raise ValueError("patch needs exactly one of client= or target=")
    replacements: Dict[int, Timesteps] = {}
    replaced: List[str] = []
    for parent_name, parent in list(
            model.named_modules(remove_duplicate=False)):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, Timesteps):
                continue
            arguments = _replaceable(child)
            if arguments is None:
                continue
            new = replacements.get(id(child))
            if new is None:
                new = replacements[id(child)] = Timesteps(
                    **arguments, client=client, target=target,
                    timeout=timeout, precision=precision)
            setattr(parent, child_name, new)
            replaced.append(f"{parent_name}.{child_name}" if parent_name
                            else child_name)
    return replaced


# The whole time conditioning (embedders and modulation Linears) served by
# a conditioning model: the temb._offload package.
from temb._offload import (OffloadedConditioning,  # noqa: E402
                           conditioning_modules, offload_conditioning)
