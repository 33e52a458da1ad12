"""Channel settings shared by the blocking and asyncio clients."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import grpc

from temb.types import TlsConfig

# Large enough for the server's default max_output_bytes (256 MiB) plus
# framing; the server enforces its own limits and reports them in
# server_info().limits.
DEFAULT_MAX_MESSAGE_BYTES = 512 << 20
DEFAULT_RETRIES = 3
# gRPC caps a retry policy at 5 attempts.
_MAX_ATTEMPTS = 5

SERVICE = "temb.v1.EmbeddingService"
HEALTH_CHECK_METHOD = "/grpc.health.v1.Health/Check"

TlsOption = Union[None, bool, TlsConfig, grpc.ChannelCredentials]
Metadata = Tuple[Tuple[str, str], ...]


def _pem(value: Union[bytes, str, None]) -> Optional[bytes]:
    return value.encode("ascii") if isinstance(value, str) else value


def service_config(retries: int) -> str:
    """A service config retrying failed calls `retries` times with backoff.

    UNAVAILABLE is retried everywhere: the request never reached a server
    (or the server was draining), and embeddings are pure, so repeating is
    safe.  The idempotent unary calls (Embed, GetServerInfo, health Check)
    also retry CANCELLED: a server that is shutting down cancels calls that
    reached it too late to be handled.  A retry policy only acts on statuses
    received from the server, so a cancel by this application (or an expired
    deadline) is never retried.  EmbedStream keeps UNAVAILABLE only: a
    cancelled stream may already have had requests answered.
    """
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    unary: Dict[str, Any] = {
        "name": [{"service": SERVICE, "method": "Embed"},
                 {"service": SERVICE, "method": "GetServerInfo"},
                 {"service": "grpc.health.v1.Health"}]}
    other: Dict[str, Any] = {"name": [{"service": SERVICE}]}
    if retries:
        for method_config, codes in ((unary, ["UNAVAILABLE", "CANCELLED"]),
                                     (other, ["UNAVAILABLE"])):
            method_config["retryPolicy"] = {
                "maxAttempts": min(retries + 1, _MAX_ATTEMPTS),
                "initialBackoff": "0.1s",
                "maxBackoff": "2s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": codes,
            }
    # gRPC picks the most specific name, so the order does not matter.
    return json.dumps({"methodConfig": [other, unary]})


def channel_options(retries: int, max_message_bytes: int,
                    tls: TlsOption,
                    extra: Sequence[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
    if max_message_bytes <= 0:
        raise ValueError(
            f"max_message_bytes must be positive, got {max_message_bytes}")
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.enable_retries", 1 if retries else 0),
        ("grpc.service_config", service_config(retries)),
    ]
    if isinstance(tls, TlsConfig) and tls.server_name_override:
        options.append(("grpc.ssl_target_name_override",
                        tls.server_name_override))
    options.extend(extra)
    return options


def credentials(tls: TlsOption) -> Optional[grpc.ChannelCredentials]:
    """None for a plaintext channel."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, TlsConfig):
        if (tls.certificate_chain is None) != (tls.private_key is None):
            raise ValueError("TlsConfig needs both certificate_chain and "
                             "private_key for client authentication, or "
                             "neither")
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(tls.root_certificates),
            private_key=_pem(tls.private_key),
            certificate_chain=_pem(tls.certificate_chain))
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    raise TypeError(f"tls must be None, a bool, a TlsConfig or "
                    f"grpc.ChannelCredentials; got {type(tls).__name__}")


def auth_metadata(auth_token: Optional[str]) -> Metadata:
    return (("authorization", f"Bearer {auth_token}"),) if auth_token else ()
