"""Exceptions raised by the temb client.

Every failed call raises a :class:`TembError`, or the subclass matching its
gRPC status code, so callers can catch either broadly or precisely::

    try:
        emb = client.embed(t, preset="sdxl")
    except temb.InvalidArgumentError as e:   # e.code, e.details
        ...
"""

from __future__ import annotations

from typing import Dict, Optional, Type

import grpc

__all__ = [
    "TembError",
    "InvalidArgumentError",
    "NotFoundError",
    "FailedPreconditionError",
    "ResourceExhaustedError",
    "UnavailableError",
    "DeadlineExceededError",
    "UnauthenticatedError",
    "error_from_code",
    "error_from_rpc",
]


class TembError(Exception):
    """A request the service (or the transport) did not complete.

    Attributes:
      code: the ``grpc.StatusCode`` of the failure.
      details: the server's message (it names the offending field).
      request_id: the request's id where one was given, else "".
    """

    def __init__(self, code: grpc.StatusCode, details: str,
                 request_id: str = "") -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.request_id = request_id


class InvalidArgumentError(TembError):
    """Malformed spec or timesteps (INVALID_ARGUMENT)."""


class NotFoundError(TembError):
    """Unknown preset, conditioning model or health service (NOT_FOUND)."""


class FailedPreconditionError(TembError):
    """A conditioning model that is still loading or failed to load (the
    details say why, naming the file) (FAILED_PRECONDITION)."""


class ResourceExhaustedError(TembError):
    """A server or message-size limit was exceeded (RESOURCE_EXHAUSTED)."""


class UnavailableError(TembError):
    """The server is unreachable or draining, after retries (UNAVAILABLE)."""


class DeadlineExceededError(TembError):
    """The call's deadline passed (DEADLINE_EXCEEDED)."""


class UnauthenticatedError(TembError):
    """Missing or wrong auth token (UNAUTHENTICATED)."""


_BY_CODE: Dict[grpc.StatusCode, Type[TembError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}

_BY_VALUE: Dict[int, grpc.StatusCode] = {
    code.value[0]: code for code in grpc.StatusCode
}


def error_from_code(code: grpc.StatusCode | int, details: str,
                    request_id: str = "") -> TembError:
    """The exception for a status code (a ``grpc.StatusCode`` or its
    number)."""
    if isinstance(code, int):
        code = _BY_VALUE.get(code, grpc.StatusCode.UNKNOWN)
    return _BY_CODE.get(code, TembError)(code, details, request_id)


def error_from_rpc(error: grpc.RpcError,
                   request_id: Optional[str] = "") -> TembError:
    """Converts what grpc raised (sync or asyncio) into a TembError."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else None
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    return error_from_code(code, details or str(error), request_id or "")
