"""Python client for temb, the sinusoidal timestep embedding service.

    import temb
    with temb.Client("localhost:50051") as client:
        emb = client.embed([999, 500, 1], preset="sdxl")   # numpy [3, 320]

`temb.aio.Client` is the asyncio variant; `temb.torch.Timesteps` (needs
PyTorch) is a drop-in for diffusers' `Timesteps` module.
"""

from temb import aio
from temb._proto import VERSION as __version__
from temb.client import Client
from temb.errors import (DeadlineExceededError, InvalidArgumentError,
                         NotFoundError, ResourceExhaustedError, TembError,
                         UnauthenticatedError, UnavailableError)
from temb.types import (HealthStatus, Limits, Preset, ServerInfo, Spec,
                        TlsConfig)

__all__ = [
    "Client",
    "aio",
    "DeadlineExceededError",
    "HealthStatus",
    "InvalidArgumentError",
    "Limits",
    "NotFoundError",
    "Preset",
    "ResourceExhaustedError",
    "ServerInfo",
    "Spec",
    "TembError",
    "TlsConfig",
    "UnauthenticatedError",
    "UnavailableError",
    "__version__",
]
