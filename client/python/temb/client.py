"""The blocking temb client.

One :class:`Client` wraps one gRPC channel; it is thread-safe, so a pipeline
should create it once and share it.  Calls raise :class:`temb.TembError`
(a subclass per status code) on failure.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Optional, Union

import grpc

from temb import _codec, _request
from temb._proto.temb.v1 import temb_pb2 as pb
from temb._request import Embedding
from temb.errors import TembError
from temb.types import HealthStatus, ServerInfo

__all__ = ["Client"]


class Client(_request.ClientBase):
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

    _grpc = grpc

    @_request.takes_embed_arguments
    def embed(self, *args: Any, **kwargs: Any) -> Embedding:
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
        call = _request.embed_call(*args, **kwargs)
        with _request.rpc_errors(call.request.request_id):
            response = self._stub.Embed(call.request,
                                        **self._call_options(call.timeout))
        return _codec.decode_tensor(response.embedding, call.decoding)

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
        state = _request.StreamState()
        call = self._stub.EmbedStream(state.requests(requests),
                                      **self._call_options(timeout))
        try:
            with _request.rpc_errors():
                for response in call:
                    yield state.result(response, raise_errors)
        finally:
            call.cancel()  # no-op once finished; stops an abandoned stream
        if state.error is not None:
            raise state.error

    def server_info(self, *, timeout: Optional[float] = None) -> ServerInfo:
        """Version, backend, device, limits and presets of the server."""
        with _request.rpc_errors():
            info = self._stub.GetServerInfo(pb.GetServerInfoRequest(),
                                            **self._call_options(timeout))
        return _codec.server_info_from_proto(info)

    def health(self, service: str = "", *,
               timeout: Optional[float] = None) -> HealthStatus:
        """grpc.health.v1 Check: "" is the whole server, or a service name
        such as "temb.v1.EmbeddingService".  NotFoundError for a service the
        server does not know."""
        with _request.rpc_errors():
            data = self._health_check(_codec.encode_health_request(service),
                                      **self._call_options(timeout))
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
