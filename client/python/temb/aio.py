"""The asyncio temb client: :class:`temb.Client`'s methods as coroutines.

Create it inside the event loop that uses it (grpc.aio channels belong to
one loop), preferably as ``async with temb.aio.Client(target) as client:``.
"""

from __future__ import annotations

import collections.abc
from typing import (Any, AsyncIterable, AsyncIterator, Iterable, Mapping,
                    Optional, Sequence, Tuple, Union)

import grpc
import grpc.aio

from temb import _channel, _codec
from temb._proto.temb.v1 import temb_pb2 as pb
from temb._proto.temb.v1 import temb_pb2_grpc as pb_grpc
from temb.client import Embedding, _Settings, _StreamState
from temb.errors import TembError, error_from_rpc
from temb.types import HealthStatus, ServerInfo

__all__ = ["Client"]


class Client:
    """See :class:`temb.Client`; the arguments and semantics are the same."""

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
            self._channel = grpc.aio.insecure_channel(target, options=s.options)
        else:
            self._channel = grpc.aio.secure_channel(target, s.credentials,
                                                    options=s.options)
        self._stub = pb_grpc.EmbeddingServiceStub(self._channel)
        # Raw bytes in and out: see _codec.encode_health_request.
        self._health_check = self._channel.unary_unary(
            _channel.HEALTH_CHECK_METHOD, request_serializer=None,
            response_deserializer=None)

    @property
    def target(self) -> str:
        return self._settings.target

    async def embed(self, timesteps: Any, dim: Optional[int] = None,
                    preset: Optional[str] = None, dtype: Optional[str] = None,
                    *, max_period: Optional[float] = None,
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
        """See :meth:`temb.Client.embed`."""
        decoding = _codec.make_decoding(return_tensors, bf16_format)
        request = _codec.build_request(
            timesteps, dim=dim, preset=preset, dtype=dtype,
            max_period=max_period, flip_sin_to_cos=flip_sin_to_cos,
            downscale_freq_shift=downscale_freq_shift, scale=scale,
            time_factor=time_factor, repeat_only=repeat_only, layout=layout,
            precision=precision, request_id=request_id)
        try:
            response = await self._stub.Embed(
                request, timeout=self._settings.deadline(timeout),
                metadata=self._settings.metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e, request_id) from None
        return _codec.decode_tensor(response.embedding, decoding)

    async def embed_stream(
            self,
            requests: Union[Iterable[Mapping[str, Any]],
                            AsyncIterable[Mapping[str, Any]]], *,
            timeout: Optional[float] = None,
            raise_errors: bool = True
    ) -> AsyncIterator[Union[Embedding, TembError]]:
        """See :meth:`temb.Client.embed_stream`; `requests` may also be an
        async iterable."""
        state = _StreamState()

        async def request_iterator() -> AsyncIterator[pb.EmbedRequest]:
            try:
                if isinstance(requests, collections.abc.AsyncIterable):
                    async for item in requests:
                        yield state.request(item)
                else:
                    for item in requests:
                        yield state.request(item)
            except Exception as e:  # surfaced to the caller after the stream
                state.error = e

        call = self._stub.EmbedStream(
            request_iterator(), timeout=self._settings.deadline(timeout),
            metadata=self._settings.metadata)
        try:
            async for response in call:
                yield state.result(response, raise_errors)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None
        finally:
            call.cancel()
        if state.error is not None:
            raise state.error

    async def server_info(self, *, timeout: Optional[float] = None
                          ) -> ServerInfo:
        """See :meth:`temb.Client.server_info`."""
        try:
            info = await self._stub.GetServerInfo(
                pb.GetServerInfoRequest(),
                timeout=self._settings.deadline(timeout),
                metadata=self._settings.metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None
        return _codec.server_info_from_proto(info)

    async def health(self, service: str = "", *,
                     timeout: Optional[float] = None) -> HealthStatus:
        """See :meth:`temb.Client.health`."""
        try:
            data = await self._health_check(
                _codec.encode_health_request(service),
                timeout=self._settings.deadline(timeout),
                metadata=self._settings.metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None
        return HealthStatus(_codec.decode_health_response(data))

    async def close(self) -> None:
        await self._channel.close(grace=None)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"temb.aio.Client({self.target!r})"
