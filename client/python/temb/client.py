"""The blocking temb client.

One :class:`Client` wraps one gRPC channel; it is thread-safe, so a pipeline
should create it once and share it.  Calls raise :class:`temb.TembError`
(a subclass per status code) on failure.
"""

from __future__ import annotations

from typing import (Any, Callable, Dict, Iterable, Iterator, Mapping,
                    Optional, Tuple, Union)

import grpc
import numpy as np

from temb import _codec, _request
from temb._proto.temb.v1 import temb_pb2 as pb
from temb._request import Embedding
from temb.errors import TembError, error_from_code
from temb.types import ConditioningModel, HealthStatus, ServerInfo

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
      transport: how embed() and embed_parts() calls travel: "auto" (the
        default: gRPC's C++ library through the ``_temb_transport``
        extension where it is built and the settings allow, else grpcio),
        "native" (that or an error) or "grpcio".  The other methods always
        use grpcio.  Results and errors are the same either way.
    """

    _grpc = grpc

    def _embed_rpc(self, call: _request.PreparedEmbed) -> Embedding:
        """One Embed call on this client's transport, decoded."""
        timeout = self._timeout if call.timeout is None else call.timeout
        if self._native is None:
            with _request.rpc_errors(call.request_id):
                data = self._embed_bytes(call.request_bytes(), timeout=timeout,
                                         metadata=self._metadata)
        else:
            shaped = call.timesteps is not None and call.timesteps.ndim > 1
            code, message, data = self._native.embed(
                call.head, call.request_id, call.timesteps, shaped, timeout)
            if code:
                raise error_from_code(code, message, call.request_id)
        return _request.decode_embed_result(call, data)

    @_request.takes_embed_arguments
    def embed(self, *args: Any, **kwargs: Any) -> Embedding:
        """Computes the embedding of a tensor of timesteps: shape
        ``timesteps.shape + [dim]``.

        Args:
          timesteps: a list, numpy array or torch tensor of rank 0 to 5:
            [N] gives [N, dim] (a scalar is a batch of one), per-token
            [B, L] gives [B, L, dim] and so on.  Floating values are sent as
            float32 (like diffusers' ``timesteps.float()``); integer values
            as integers.
          dim, preset, max_period, flip_sin_to_cos, downscale_freq_shift,
            scale, time_factor, repeat_only: the convention, with diffusers'
            names.  None leaves a field unset: with a preset the preset
            decides; without one, dim, flip_sin_to_cos and
            downscale_freq_shift are required by the server.
          dtype: "fp32" | "fp16" | "bf16" | "fp64", or a torch/numpy dtype
            (None: the preset's default, else fp32).  fp16/bf16 are the fp32
            result rounded to nearest even.
          timestep_dtype: "fp32" | "fp16" | "bf16" (or a torch/numpy dtype):
            the dtype a fp16/bf16 pipeline holds t in.  The server rounds t
            to it and applies time_factor in it, as diffusers' Flux does
            with ``timestep.to(dtype) * 1000``.  None: fp32.
          frequencies: dim/2 frequencies replacing the formula's (learned
            ones); log_spaced_frequencies: (min, max) of a log-spaced table.
          layout: "halves" | "interleaved".  precision: "fp32" | "fp64".
          exponent_order: "divide_last" (default) | "slope_first": the
            float32 order of -ln(P) * i / (H - shift) in the model's code
            (``arange(half) * -(ln P / (half - 1))`` is slope_first).
          parts: several named embeddings in one call, as in
            :meth:`embed_parts` (timesteps must then be None); the result
            is then a dict.
          request_id: echoed by the server, for tracing.
          timeout: this call's deadline in seconds (None: the client's).
          return_tensors: "np" (numpy) or "pt" (a CPU torch tensor).
          bf16_format: numpy representation of bf16 results: "auto"
            (ml_dtypes.bfloat16 when installed, else "float32"), "float32"
            (float32 holding the exact bf16 values), "bits" (raw uint16),
            "ml_dtypes".

        Returns:
          A writable array of shape timesteps.shape + [dim] ([N, dim] for
          1-D timesteps): float32/float16/float64 for those dtypes; bf16 as
          described above (torch.bfloat16 with "pt").

        Raises:
          TembError (InvalidArgumentError, NotFoundError,
          ResourceExhaustedError, ...), ValueError/TypeError for arguments
          that cannot be encoded at all.
        """
        return self._embed_rpc(self._plans.prepare(args, kwargs))

    def embed_function(self, *, timeout: Optional[float] = None,
                       **arguments: Any
                       ) -> Optional[Callable[[Any], Embedding]]:
        """``embed(timesteps, timeout=timeout, **arguments)`` as a function
        of the timesteps alone, for a caller that repeats one call with new
        timesteps (temb.torch's modules, at every denoising step): the
        arguments are checked and the request without its timesteps is
        encoded once, here; each call adds only the timesteps and sends it.

        Args:
          timeout, arguments: :meth:`embed`'s keyword arguments, but
            timesteps, parts and request_id.

        Returns:
          A function of 1-D, C-contiguous float32 timesteps (a numpy array,
          or a torch tensor on the CPU; anything else: call :meth:`embed`),
          returning what :meth:`embed` returns and raising what it raises
          (what only the server refuses, such as dim=0, at each call).
          None where this client's embed calls do not use the native
          transport (:attr:`transport`): call :meth:`embed` then.  In a
          process forked after the function was made, it calls
          :meth:`embed`, which the client then makes through grpcio.
        """
        _request.check_function_arguments(arguments)
        native = self._native
        if native is None:
            return None
        call = _request.embed_call(np.zeros(0, np.float32), **arguments)
        head = _request.request_head(call.request)
        decoding = call.decoder.decoding
        deadline = self._timeout if timeout is None else timeout

        def embed(timesteps: Any) -> Embedding:
            array = (timesteps if type(timesteps) is np.ndarray
                     else timesteps.detach().resolve_neg().numpy())
            if self._native is not native:  # a forked child: grpcio now
                return self.embed(array, timeout=timeout, **arguments)
            code, message, data = native.embed(head, "", array, False,
                                               deadline)
            if code:
                raise error_from_code(code, message, "")
            # embed()'s own check of the answer's shape, and its result.
            return _request.ResponseDecoder(
                decoding, (array.shape,)).decode_array(data)

        return embed

    @_request.takes_embed_parts_arguments
    def embed_parts(self, *args: Any, **kwargs: Any) -> Dict[str, Embedding]:
        """Several named embeddings in one call, e.g. everything one
        denoising step of Flux needs::

            emb = client.embed_parts({"timestep": t, "guidance": g},
                                     preset="flux", timestep_dtype="bf16")
            emb["timestep"], emb["guidance"]      # [B, 256] each

        Args:
          parts: part name -> timesteps (anything :meth:`embed` takes, any
            shape), or part name -> a dict with "timesteps" and any of
            "preset", "dtype", "dim", "timestep_dtype", "precision", the
            convention keywords, "frequencies", "log_spaced_frequencies".
          preset: a part without its own preset or convention uses the
            preset's part of its name (``server_info().preset(name).parts``,
            e.g. sdxl: "time" and "add_time"; pixart: "timestep",
            "resolution", "aspect_ratio"), else the preset itself.
          The other arguments are :meth:`embed`'s; dtype, precision and
          timestep_dtype apply to the parts that leave them unset.

        Returns:
          A dict, in the order of `parts`, of part name -> array of shape
          that part's timesteps shape + [dim].
        """
        call = _request.embed_parts_call(*args, **kwargs)
        return self._embed_rpc(_request.PreparedEmbed(
            call.request.SerializeToString(), call.request.request_id, None,
            call.decoder, call.timeout))

    def embed_stream(self, requests: Iterable[Mapping[str, Any]], *,
                     timeout: Optional[float] = None,
                     raise_errors: bool = True
                     ) -> Iterator[Union[Embedding, Dict[str, Embedding],
                                         TembError]]:
        """Runs many requests over one stream; yields results in order.

        Each item of `requests` is a mapping of :meth:`embed`'s keyword
        arguments (``timesteps`` or ``parts`` included, ``timeout``
        excluded); an item with ``parts`` yields a dict, as
        :meth:`embed_parts`.  Items are consumed lazily, so the iterable may
        be a generator.

        Errors: a request the server rejects raises its TembError when
        `raise_errors` (the stream is then cancelled), or is yielded as a
        TembError in its place otherwise, and the stream goes on.  A failure
        of the stream itself (e.g. UNAVAILABLE, DEADLINE_EXCEEDED) always
        raises.  An item that cannot be encoded ends the stream after the
        results before it and raises its ValueError/TypeError.

        `timeout` bounds the whole stream.
        """
        yield from self._stream(self._stub.EmbedStream,
                                _request.StreamState(), requests, timeout,
                                raise_errors)

    def _stream(self, method: Any, state: Any,
                requests: Iterable[Mapping[str, Any]],
                timeout: Optional[float], raise_errors: bool) -> Iterator[Any]:
        """The results of a bidirectional stream `method`, its requests
        encoded and its answers decoded by `state`."""
        call = method(state.requests(requests), **self._call_options(timeout))
        try:
            with _request.rpc_errors():
                for response in call:
                    yield state.result(response, raise_errors)
        finally:
            call.cancel()  # no-op once finished; stops an abandoned stream
        if state.error is not None:
            raise state.error

    def condition(self, model: str, timesteps: Any = None,
                  guidance: Any = None, pooled_projections: Any = None,
                  outputs: Any = None,
                  return_tensors: Optional[str] = None, *,
                  request_id: Optional[str] = None,
                  timeout: Optional[float] = None, bf16_format: str = "auto",
                  **extras: Any) -> Dict[str, Any]:
        """A diffusion transformer's time conditioning, computed by the
        server's conditioning model `model` (a folder of its
        --model_repository; :meth:`models` lists them)::

            cond = client.condition("qwen-image", scheduler.timesteps)
            cond["img_mod"]        # [N, blocks, 6D], the model's dtype

        Args:
          model: the conditioning model's name.
          timesteps: [N] (a scalar is one), or per-token timesteps of rank 2
            or more (Wan 2.2 TI2V's [B, L]): the answer then holds the rows
            of the distinct values and an int64 "index" output of the
            timesteps' shape mapping each to its row.
          guidance: [N] or one value shared by every row (models with a
            guidance embedder, e.g. FLUX.1-dev).
          pooled_projections: [N, P] or one row [P] (FLUX.1, SD3), e.g. a
            bf16 torch tensor as the pipeline holds it.
          outputs: the outputs to compute, by name (default: all of the
            model's, see ``ConditioningModel.outputs``).
          return_tensors: "np" (default) or "pt": CPU torch tensors in the
            model's dtype (torch.bfloat16 for a bf16 model).
          extras: a family's other inputs by name (e.g. ``resolution=``),
            and ``timestep=`` in place of `timesteps`: the transformer
            forward's own timestep argument, exactly as the pipeline passed
            it (Qwen-Image's ``t.to(bf16) / 1000``), sent bit for bit; the
            server applies no conversion to it and refuses a value the
            forward could not have received (its ``ConditioningInput``
            names the value it stands for, ``stands_for``).
          request_id, timeout: as for :meth:`embed`.
          bf16_format: numpy's representation of bf16 outputs, as for
            :meth:`embed`.

        Every input travels exactly: float32, float16 and bfloat16 values
        as they are; other floating values become float32 first (as
        diffusers' ``.float()``, and :meth:`embed`, do); integers where
        exact (up to 2^24).

        Returns:
          A dict of output name -> array, in the model's order (that of
          ``ConditioningModel.outputs``), each [N] + the output's row
          shape.

        Raises:
          NotFoundError (no such model), FailedPreconditionError (the
          model is loading or failed to load), InvalidArgumentError naming
          the input or output, ResourceExhaustedError (a server limit).
        """
        request, decoding = _request.condition_call(
            model, timesteps, guidance, pooled_projections, outputs,
            return_tensors, request_id=request_id, bf16_format=bf16_format,
            **extras)
        try:
            with _request.rpc_errors(request.request_id):
                response = self._stub.Condition(request,
                                                **self._call_options(timeout))
        except TembError as error:
            raise _codec.explain_condition_error(error, request) from None
        return _codec.condition_result(response, decoding)

    def condition_stream(self, requests: Iterable[Mapping[str, Any]], *,
                         timeout: Optional[float] = None,
                         raise_errors: bool = True
                         ) -> Iterator[Union[Dict[str, Any], TembError]]:
        """Many :meth:`condition` calls over one stream (ConditionStream);
        yields their results in order.  Each item is a mapping of
        :meth:`condition`'s arguments by name (``model`` and ``timesteps``
        included, ``timeout`` excluded), consumed lazily.  Errors as in
        :meth:`embed_stream`: a refused request raises its TembError (or,
        with ``raise_errors=False``, is yielded in its place and the stream
        goes on); `timeout` bounds the whole stream."""
        yield from self._stream(self._stub.ConditionStream,
                                _request.ConditionStreamState(), requests,
                                timeout, raise_errors)

    def models(self, *, timeout: Optional[float] = None
               ) -> Tuple[ConditioningModel, ...]:
        """The server's conditioning models, in name order, each with its
        state now ("loading", "ready", or "failed" with the cause), family,
        dtype, inputs and outputs (``server_info().conditioning_models``)."""
        return self.server_info(timeout=timeout).conditioning_models

    def server_info(self, *, timeout: Optional[float] = None) -> ServerInfo:
        """Version, backend, device, limits and presets of the server, and
        its conditioning models and their row cache."""
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

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"temb.Client({self.target!r})"
