"""The asyncio temb client: :class:`temb.Client`'s methods as coroutines.

Create it inside the event loop that uses it (grpc.aio channels belong to
one loop), preferably as ``async with temb.aio.Client(target) as client:``.

``embed()`` and ``embed_parts()`` travel as :class:`temb.Client`'s do
(``transport=``): through gRPC's C++ library where the ``_temb_transport``
extension is built (the call is started in C++; gRPC's thread queues its
result and signals an eventfd the loop watches), else through grpc.aio.
The other methods always use grpc.aio.
"""

from __future__ import annotations

import asyncio
import collections.abc
from typing import (Any, AsyncIterable, AsyncIterator, Dict, Iterable,
                    Iterator, Mapping, Optional, Tuple, Union)

import grpc.aio

from temb import _codec, _request, _transport
from temb._proto.temb.v1 import temb_pb2 as pb
from temb._request import Embedding
from temb.errors import TembError, error_from_code
from temb.types import ConditioningModel, HealthStatus, ServerInfo

__all__ = ["Client"]

_CANCELLED = grpc.StatusCode.CANCELLED.value[0]


class Client(_request.ClientBase):
    """See :class:`temb.Client`; the arguments and semantics are the same."""

    _grpc = grpc.aio

    def _open_transport(self, transport: str, options: Any) -> None:
        super()._open_transport(transport, options)
        # The native calls in flight by token (their futures and calls),
        # and where they end (made on the first call, in the client's loop).
        self._waiting: Dict[int, Tuple[asyncio.Future[Any], Any]] = {}
        self._next_token = 0
        self._completions: Any = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def _watch_completions(self) -> Tuple[Any, asyncio.AbstractEventLoop]:
        """The native completions and the client's loop (the running one,
        where they are watched)."""
        loop = asyncio.get_running_loop()
        if self._completions is None:
            self._completions = self._native_module().Completions()
            self._loop = loop
            loop.add_reader(self._completions.fd, self._drain)
        elif loop is not self._loop:
            raise RuntimeError("this temb.aio.Client belongs to another event "
                               "loop: create it in the loop that uses it")
        return self._completions, loop

    @staticmethod
    def _native_module() -> Any:
        return _transport._extension()

    def _forget_native(self) -> Any:
        """In a forked child: embed calls move to grpc.aio
        (temb._transport); the parent's calls in flight are left alone."""
        held = (self._native, self._completions, self._waiting)
        self._native, self._completions, self._waiting = None, None, {}
        self._transport_reason = _transport.FORKED_REASON
        return held

    def _drain(self) -> None:
        for token, outcome in self._completions.drain():
            waiting = self._waiting.pop(token, None)
            if waiting is not None and not waiting[0].done():
                waiting[0].set_result(outcome)

    @_request.takes_embed_arguments
    async def embed(self, *args: Any, **kwargs: Any) -> Embedding:
        """See :meth:`temb.Client.embed`."""
        return await self._embed_rpc(self._plans.prepare(args, kwargs))

    @_request.takes_embed_parts_arguments
    async def embed_parts(self, *args: Any, **kwargs: Any
                          ) -> Dict[str, Embedding]:
        """See :meth:`temb.Client.embed_parts`."""
        call = _request.embed_parts_call(*args, **kwargs)
        return await self._embed_rpc(_request.PreparedEmbed(
            call.request.SerializeToString(), call.request.request_id, None,
            call.decoder, call.timeout))

    async def _embed_rpc(self, call: _request.PreparedEmbed) -> Embedding:
        """One Embed call on this client's transport, decoded."""
        timeout = self._timeout if call.timeout is None else call.timeout
        native = self._native
        if native is None:
            with _request.rpc_errors(call.request_id):
                data = await self._embed_bytes(
                    call.request_bytes(), timeout=timeout,
                    metadata=self._metadata)
            return _request.decode_embed_result(call, data)
        completions, loop = self._watch_completions()
        token = self._next_token = self._next_token + 1
        result = loop.create_future()
        shaped = call.timesteps is not None and call.timesteps.ndim > 1
        pending = native.embed_async(call.head, call.request_id,
                                     call.timesteps, shaped, timeout,
                                     completions, token)
        self._waiting[token] = (result, pending)
        try:
            code, message, data = await result
        except asyncio.CancelledError:
            self._waiting.pop(token, None)
            pending.cancel()
            raise
        if code:
            raise error_from_code(code, message, call.request_id)
        return _request.decode_embed_result(call, data)

    async def embed_stream(
            self,
            requests: Union[Iterable[Mapping[str, Any]],
                            AsyncIterable[Mapping[str, Any]]], *,
            timeout: Optional[float] = None,
            raise_errors: bool = True
    ) -> AsyncIterator[Union[Embedding, Dict[str, Embedding], TembError]]:
        """See :meth:`temb.Client.embed_stream`; `requests` may also be an
        async iterable."""
        async for result in self._stream(
                self._stub.EmbedStream, _request.StreamState(), requests,
                timeout, raise_errors):
            yield result

    async def _stream(self, method: Any, state: Any,
                      requests: Union[Iterable[Mapping[str, Any]],
                                      AsyncIterable[Mapping[str, Any]]],
                      timeout: Optional[float],
                      raise_errors: bool) -> AsyncIterator[Any]:
        """The results of a bidirectional stream `method`, its requests
        encoded and its answers decoded by `state`."""
        # grpc.aio takes either kind of iterable.
        request_iterator: Union[Iterator[Any], AsyncIterator[Any]]
        if isinstance(requests, collections.abc.AsyncIterable):
            request_iterator = state.async_requests(requests)
        else:
            request_iterator = state.requests(requests)
        call = method(request_iterator, **self._call_options(timeout))
        try:
            with _request.rpc_errors():
                async for response in call:
                    yield state.result(response, raise_errors)
        finally:
            call.cancel()
        if state.error is not None:
            raise state.error

    async def condition(self, model: str, timesteps: Any = None,
                        guidance: Any = None, pooled_projections: Any = None,
                        outputs: Any = None,
                        return_tensors: Optional[str] = None, *,
                        request_id: Optional[str] = None,
                        timeout: Optional[float] = None,
                        bf16_format: str = "auto",
                        **extras: Any) -> Dict[str, Any]:
        """See :meth:`temb.Client.condition`."""
        request, decoding = _request.condition_call(
            model, timesteps, guidance, pooled_projections, outputs,
            return_tensors, request_id=request_id, bf16_format=bf16_format,
            **extras)
        try:
            with _request.rpc_errors(request.request_id):
                response = await self._stub.Condition(
                    request, **self._call_options(timeout))
        except TembError as error:
            raise _codec.explain_condition_error(error, request) from None
        return _codec.condition_result(response, decoding)

    async def condition_stream(
            self,
            requests: Union[Iterable[Mapping[str, Any]],
                            AsyncIterable[Mapping[str, Any]]], *,
            timeout: Optional[float] = None,
            raise_errors: bool = True
    ) -> AsyncIterator[Union[Dict[str, Any], TembError]]:
        """See :meth:`temb.Client.condition_stream`; `requests` may also be
        an async iterable."""
        async for result in self._stream(
                self._stub.ConditionStream, _request.ConditionStreamState(),
                requests, timeout, raise_errors):
            yield result

    async def models(self, *, timeout: Optional[float] = None
                     ) -> Tuple[ConditioningModel, ...]:
        """See :meth:`temb.Client.models`."""
        return (await self.server_info(timeout=timeout)).conditioning_models

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
        """Closes the channel; calls in flight are cancelled (they raise a
        TembError with code CANCELLED)."""
        completions, self._completions = self._completions, None
        self._native = None  # later calls fail on the closed grpc.aio channel
        if completions is not None:
            loop = self._loop
            assert loop is not None  # set with the completions
            loop_open = not loop.is_closed()
            if loop_open:
                loop.remove_reader(completions.fd)
            waiting, self._waiting = self._waiting, {}
            for result, pending in waiting.values():
                pending.cancel()
                if loop_open and not result.done():
                    result.set_result((_CANCELLED, "the client was closed",
                                       None))
        await self._channel.close(grace=None)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"temb.aio.Client({self.target!r})"
