"""The asyncio temb client: :class:`temb.Client`'s methods as coroutines.

Create it inside the event loop that uses it (grpc.aio channels belong to
one loop), preferably as ``async with temb.aio.Client(target) as client:``.
"""

from __future__ import annotations

import collections.abc
from typing import (Any, AsyncIterable, AsyncIterator, Dict, Iterable,
                    Iterator, Mapping, Optional, Union)

import grpc.aio

from temb import _codec, _request
from temb._proto.temb.v1 import temb_pb2 as pb
from temb._request import Embedding
from temb.errors import TembError
from temb.types import HealthStatus, ServerInfo

__all__ = ["Client"]


class Client(_request.ClientBase):
    """See :class:`temb.Client`; the arguments and semantics are the same."""

    _grpc = grpc.aio

    @_request.takes_embed_arguments
    async def embed(self, *args: Any, **kwargs: Any) -> Embedding:
        """See :meth:`temb.Client.embed`."""
        call = _request.embed_call(*args, **kwargs)
        with _request.rpc_errors(call.request.request_id):
            response = await self._stub.Embed(
                call.request, **self._call_options(call.timeout))
        return call.decoder.decode(response)

    @_request.takes_embed_parts_arguments
    async def embed_parts(self, *args: Any, **kwargs: Any
                          ) -> Dict[str, Embedding]:
        """See :meth:`temb.Client.embed_parts`."""
        call = _request.embed_parts_call(*args, **kwargs)
        with _request.rpc_errors(call.request.request_id):
            response = await self._stub.Embed(
                call.request, **self._call_options(call.timeout))
        return call.decoder.decode(response)

    async def embed_stream(
            self,
            requests: Union[Iterable[Mapping[str, Any]],
                            AsyncIterable[Mapping[str, Any]]], *,
            timeout: Optional[float] = None,
            raise_errors: bool = True
    ) -> AsyncIterator[Union[Embedding, Dict[str, Embedding], TembError]]:
        """See :meth:`temb.Client.embed_stream`; `requests` may also be an
        async iterable."""
        state = _request.StreamState()
        # grpc.aio takes either kind of iterable.
        request_iterator: Union[Iterator[pb.EmbedRequest],
                                AsyncIterator[pb.EmbedRequest]]
        if isinstance(requests, collections.abc.AsyncIterable):
            request_iterator = state.async_requests(requests)
        else:
            request_iterator = state.requests(requests)
        call = self._stub.EmbedStream(request_iterator,
                                      **self._call_options(timeout))
        try:
            with _request.rpc_errors():
                async for response in call:
                    yield state.result(response, raise_errors)
        finally:
            call.cancel()
        if state.error is not None:
            raise state.error

    async def server_info(self, *, timeout: Optional[float] = None
                          ) -> ServerInfo:
        """See :meth:`temb.Client.server_info`."""
        with _request.rpc_errors():
            info = await self._stub.GetServerInfo(
                pb.GetServerInfoRequest(), **self._call_options(timeout))
        return _codec.server_info_from_proto(info)

    async def health(self, service: str = "", *,
                     timeout: Optional[float] = None) -> HealthStatus:
        """See :meth:`temb.Client.health`."""
        with _request.rpc_errors():
            data = await self._health_check(
                _codec.encode_health_request(service),
                **self._call_options(timeout))
        return HealthStatus(_codec.decode_health_response(data))

    async def close(self) -> None:
        await self._channel.close(grace=None)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"temb.aio.Client({self.target!r})"
