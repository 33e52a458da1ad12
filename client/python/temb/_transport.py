"""How temb.Client and temb.aio.Client make their Embed calls.

Two transports carry the same bytes:
  * "grpcio": the grpc package's channel (grpc.aio's for temb.aio; always
    there);
  * "native": gRPC's C++ library through the ``_temb_transport`` extension,
    with the GIL released for the whole call.  At batch 1 most of a grpcio
    call is Python-side machinery; the native call leaves only building
    the request and decoding the response in Python (the same code for
    both).
"auto" (the default) takes the native one when its extension loads and the
client's settings can be expressed to it (TLS as True or a TlsConfig, not
ready-made grpc.ChannelCredentials; integer or string channel options),
else grpcio.  ``$TEMB_TRANSPORT`` overrides "auto" (grpcio or native).  A
client tells which it uses and why not the native one (``transport``,
``transport_reason``); where "auto" falls back because the extension is
missing (a package built without gRPC's C++ development files), the first
such client of a process also warns (RuntimeWarning), once.

After fork(), gRPC's C++ library is unusable in the child of a process that
has used it (the extension says why), while grpcio's own copy of gRPC
handles fork: in such a child every native client moves its embed calls to
grpcio (grpc.aio), and new clients are made with it ("native" raises).
"""

from __future__ import annotations

import os
import warnings
import weakref
from typing import Any, List, Optional, Sequence, Tuple

import grpc

from temb import _channel, _native
from temb._proto import VERSION
from temb.types import TlsConfig

TRANSPORTS = ("auto", "grpcio", "native")
TRANSPORT_VARIABLE = "TEMB_TRANSPORT"
_EXTENSION = "_temb_transport"

_module: Any = None
# Set in a child forked from a process that had loaded the extension.
_forked_from_user = False
FORKED_REASON = ("this process was forked from one that used gRPC's C++ "
                 "library, which does not survive fork()")
# Whether this process has warned that "auto" fell back to grpcio.
_warned_missing = False
# The clients with a native channel, told when this process is a forked
# child.
_native_clients: weakref.WeakSet[Any] = weakref.WeakSet()
# What those clients held, in such a child: the parent's channels and
# calls, kept here for good (the extension would not close them anyway).
_inherited: List[Any] = []


def _after_fork_in_child() -> None:
    global _forked_from_user
    if _module is None:
        return
    _forked_from_user = True
    for client in list(_native_clients):
        _inherited.append(client._forget_native())
    _native_clients.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def track(client: Any) -> None:
    """Registers a client holding a native channel (see fork above): in a
    forked child, its ``_forget_native()`` is called, which must stop its
    native calls and return what it held."""
    _native_clients.add(client)


def _extension() -> Any:
    global _module
    if _module is None:
        module = _native.load(_EXTENSION, "temb_transport_ext")
        built_from = getattr(module, "version", "an older version")
        if built_from != VERSION:
            raise ImportError(
                f"the extension {module.__file__} was built from temb "
                f"{built_from}, this client is {VERSION}: rebuild it")
        _module = module
    return _module


def _missing_reason(error: ImportError) -> str:
    """Why the extension is not there: what the package's build recorded,
    else the loader's message (a checkout, or TEMB_LOCAL_EXTENSION_DIR)."""
    return _native.recorded_missing("NATIVE_TRANSPORT_MISSING") or str(error)


def _warn_missing_once(reason: str) -> None:
    global _warned_missing
    if _warned_missing:
        return
    _warned_missing = True
    warnings.warn(
        f"temb.Client makes its calls through grpcio, not gRPC's C++ "
        f"library: {reason}.  transport=\"grpcio\" or "
        f"${TRANSPORT_VARIABLE}=grpcio chooses grpcio without this warning.",
        RuntimeWarning, stacklevel=5)


def _pem_text(value: Any) -> bytes:
    if value is None:
        return b""
    return value.encode("ascii") if isinstance(value, str) else bytes(value)


def _why_not(tls: _channel.TlsOption,
             options: Sequence[Tuple[str, Any]]) -> Optional[str]:
    """Why these settings need grpcio, or None."""
    if isinstance(tls, grpc.ChannelCredentials):
        return "tls is a grpc.ChannelCredentials"
    for name, value in options:
        if not isinstance(value, (bool, int, str)):
            return f"channel option {name} is a {type(value).__name__}"
    return None


def native_channel(transport: str, target: str, tls: _channel.TlsOption,
                   options: Sequence[Tuple[str, Any]],
                   metadata: _channel.Metadata) -> Tuple[Any, Optional[str]]:
    """``(a _temb_transport.Channel for these settings, None)``, or
    ``(None, why the client uses grpcio)``.  ``transport="native"`` raises
    (ImportError, ValueError) where "auto" falls back."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got "
                         f"{transport!r}")
    if transport == "auto":
        chosen = os.environ.get(TRANSPORT_VARIABLE) or "auto"
        if chosen not in TRANSPORTS:
            raise ValueError(f"${TRANSPORT_VARIABLE} must be one of "
                             f"{TRANSPORTS}, got {chosen!r}")
        if chosen == "grpcio":
            return None, f"${TRANSPORT_VARIABLE}=grpcio"
        transport = chosen
    if transport == "grpcio":
        return None, 'transport="grpcio"'
    why = FORKED_REASON if _forked_from_user else _why_not(tls, options)
    if why is not None:
        if transport == "native":
            raise ValueError(f'transport="native" cannot be used: {why}')
        return None, why
    try:
        module = _extension()
    except ImportError as error:
        if transport == "native":
            raise
        reason = _missing_reason(error)
        _warn_missing_once(reason)
        return None, reason
    roots = key = chain = b""
    if isinstance(tls, TlsConfig):
        roots = _pem_text(tls.root_certificates)
        key = _pem_text(tls.private_key)
        chain = _pem_text(tls.certificate_chain)
    native_options = [(name, int(value) if isinstance(value, bool) else value)
                      for name, value in options]
    return module.Channel(target, tls not in (None, False), roots, key, chain,
                          native_options, list(metadata)), None
