"""An independent float64 model of temb's numerical contract (the README's
"What temb computes"): the formulas and the presets' conventions are written
down here from the published model code, not read back from the server."""

from typing import Any, Dict, Optional, Tuple

import numpy as np

# name -> (default dim, convention); "transformer" and "ldm" have no default
# dim.
PRESETS: Dict[str, Tuple[Optional[int], Dict[str, Any]]] = {
    "sd15": (320, dict(flip_sin_to_cos=True, downscale_freq_shift=0)),
    "sdxl": (320, dict(flip_sin_to_cos=True, downscale_freq_shift=0)),
    "ddpm": (128, dict(flip_sin_to_cos=False, downscale_freq_shift=1)),
    "dit": (256, dict(flip_sin_to_cos=True, downscale_freq_shift=0)),
    "dit-diffusers": (256, dict(flip_sin_to_cos=True, downscale_freq_shift=1)),
    "flux": (256, dict(flip_sin_to_cos=True, downscale_freq_shift=0,
                       time_factor=1000.0)),
    "transformer": (None, dict(flip_sin_to_cos=False, downscale_freq_shift=0,
                               layout="interleaved")),
    "ldm": (None, dict(flip_sin_to_cos=True, downscale_freq_shift=0)),
}


def _timesteps(timesteps):
    # Timesteps travel as float32: round them the same way first.
    return (np.asarray(timesteps, dtype=np.float32).astype(np.float64)
            .reshape(-1))


def embedding(timesteps, dim, *, flip_sin_to_cos, downscale_freq_shift=0.0,
              max_period=10000.0, scale=1.0, time_factor=1.0,
              repeat_only=False, layout="halves", frequencies=None):
    """The [N, dim] embedding in float64; an odd dim ends with a zero column.
    `frequencies` (dim // 2 values) replaces the exp formula."""
    t = _timesteps(timesteps)
    if repeat_only:
        return np.repeat(t[:, None], dim, axis=1)
    half = dim // 2
    i = np.arange(half, dtype=np.float64)
    if frequencies is not None and len(frequencies) > 0:
        freqs = np.asarray(frequencies, dtype=np.float64)
    else:
        freqs = np.exp(-np.log(max_period) * i / (half - downscale_freq_shift))
    angles = scale * ((time_factor * t)[:, None] * freqs[None, :])
    sin, cos = np.sin(angles), np.cos(angles)
    first, second = (cos, sin) if flip_sin_to_cos else (sin, cos)
    out = np.zeros((t.size, dim), dtype=np.float64)
    if layout == "interleaved":
        out[:, 0:2 * half:2] = first
        out[:, 1:2 * half:2] = second
    else:
        out[:, :half] = first
        out[:, half:2 * half] = second
    return out


def preset_embedding(preset, timesteps, dim=None):
    """embedding() with a preset's convention (and default dim)."""
    default_dim, convention = PRESETS[preset]
    return embedding(timesteps, dim or default_dim, **convention)


def fp32_bound(timesteps, scale=1.0, time_factor=1.0):
    """The guide's accuracy bound for the fp32 path, per row: 1e-6 +
    5e-7 * |scale * t| (t after time_factor), as a column vector."""
    t = _timesteps(timesteps)
    return (1e-6 + 5e-7 * np.abs(scale * time_factor * t))[:, None]


def preset_fp32_bound(preset, timesteps):
    """fp32_bound() with a preset's time_factor."""
    time_factor = PRESETS[preset][1].get("time_factor", 1.0)
    return fp32_bound(timesteps, time_factor=time_factor)


def to_bf16_bits(values):
    """float32 -> bfloat16 bit patterns, round to nearest even (finite
    input)."""
    bits = (np.asarray(values, dtype=np.float32).view(np.uint32)
            .astype(np.uint64))
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + rounding) >> 16).astype(np.uint16)


def bf16_bits_to_float32(bits):
    return ((np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16)
            .view(np.float32))
