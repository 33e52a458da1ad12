"""Python client for temb, the sinusoidal timestep embedding service.

    import temb
    with temb.Client("localhost:50051") as client:
        emb = client.embed([999, 500, 1], preset="sdxl")   # numpy [3, 320]
        # per-token timesteps [B, L] -> [B, L, 256]
        emb = client.embed(t_per_token, preset="ltx-video")
        parts = client.embed_parts({"timestep": sigmas, "guidance": g},
                                   preset="flux", timestep_dtype="bf16")
        cond = client.condition("flux-dev", t, guidance=3.5,
                                pooled_projections=pooled)  # name -> array

`temb.aio.Client` is the asyncio variant; `temb.torch` (needs PyTorch) has
`Timesteps`, a drop-in for diffusers' `Timesteps` module, and `patch(model)`,
which swaps every one of them in a model.
"""

from temb import aio
from temb._proto import VERSION as __version__
from temb.client import Client
from temb.errors import (DeadlineExceededError, FailedPreconditionError,
                         InvalidArgumentError, NotFoundError,
                         ResourceExhaustedError, TembError,
                         UnauthenticatedError, UnavailableError)
from temb.types import (ConditioningInput, ConditioningModel,
                        ConditioningOutput, FoldedModule, HealthStatus,
                        Limits, Preset, RowCacheStats, ServerInfo, Spec,
                        TlsConfig)

__all__ = [
    "Client",
    "ConditioningInput",
    "ConditioningModel",
    "ConditioningOutput",
    "FoldedModule",
    "aio",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "HealthStatus",
    "InvalidArgumentError",
    "Limits",
    "NotFoundError",
    "Preset",
    "ResourceExhaustedError",
    "RowCacheStats",
    "ServerInfo",
    "Spec",
    "TembError",
    "TlsConfig",
    "UnauthenticatedError",
    "UnavailableError",
    "__version__",
]
