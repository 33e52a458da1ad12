"""`Timesteps`: a drop-in for diffusers' `Timesteps` module, computed by temb.

    from temb.torch import Timesteps
    time_proj = Timesteps(320, flip_sin_to_cos=True, downscale_freq_shift=0,
                          target="localhost:50051")
    t_emb = time_proj(timesteps)          # [N, 320] float32, on timesteps' device

Importing this module needs PyTorch (pip install "temb[torch]").
"""

from __future__ import annotations

from typing import Any, Optional

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "temb.torch needs PyTorch, which is not installed: "
        'pip install "temb[torch]"') from e

from temb.client import Client

__all__ = ["Timesteps"]


class Timesteps(torch.nn.Module):
    """diffusers.models.embeddings.Timesteps, evaluated by a temb server.

    The first four arguments are diffusers'.  Exactly one of `client` (a
    shared :class:`temb.Client`, the better choice for many modules) or
    `target` (this module then owns a client) must be given.  `max_period`
    and `precision` ("fp32" | "fp64") are passed through when set.

    forward(timesteps) takes a 0-D or 1-D tensor (or anything
    :meth:`temb.Client.embed` accepts) and returns a float32 tensor of shape
    [N, num_channels] on the timesteps' device.  The module has no
    parameters or buffers, like diffusers'.
    """

    def __init__(self, num_channels: int, flip_sin_to_cos: bool,
                 downscale_freq_shift: float, scale: float = 1, *,
                 client: Optional[Client] = None,
                 target: Optional[str] = None,
                 max_period: Optional[float] = None,
                 precision: Optional[str] = None,
                 timeout: Optional[float] = None) -> None:
        super().__init__()
        if client is None and target is not None:
            client, self._owns_client = Client(target), True
        elif client is not None and target is None:
            self._owns_client = False
        else:
            raise ValueError("Timesteps needs exactly one of client= or target=")
        self.num_channels = num_channels
        self.flip_sin_to_cos = flip_sin_to_cos
        self.downscale_freq_shift = downscale_freq_shift
        self.scale = scale
        self.max_period = max_period
        self.precision = precision
        self.timeout = timeout
        self.client = client

    def forward(self, timesteps: Any) -> torch.Tensor:
        embedding = self.client.embed(
            timesteps, dim=self.num_channels,
            flip_sin_to_cos=self.flip_sin_to_cos,
            downscale_freq_shift=self.downscale_freq_shift, scale=self.scale,
            max_period=self.max_period, precision=self.precision,
            dtype="fp32", timeout=self.timeout, return_tensors="pt")
        if isinstance(timesteps, torch.Tensor) and timesteps.device.type != "cpu":
            embedding = embedding.to(timesteps.device)
        return embedding

    def close(self) -> None:
        """Closes the client if this module created it."""
        if self._owns_client:
            self.client.close()

    def extra_repr(self) -> str:
        return (f"num_channels={self.num_channels}, "
                f"flip_sin_to_cos={self.flip_sin_to_cos}, "
                f"downscale_freq_shift={self.downscale_freq_shift}, "
                f"scale={self.scale}, target={self.client.target!r}")
