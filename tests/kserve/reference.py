"""An independent float64 model of temb's numerical contract, for the
protocol tests: the conventions are written down here from the published
model code, not read back from the server."""

import numpy as np

# name -> (dim, flip_sin_to_cos, downscale_freq_shift, time_factor, layout)
PRESETS = {
    "sd15": (320, True, 0, 1.0, "halves"),
    "sdxl": (320, True, 0, 1.0, "halves"),
    "ddpm": (128, False, 1, 1.0, "halves"),
    "dit": (256, True, 0, 1.0, "halves"),
    "dit-diffusers": (256, True, 1, 1.0, "halves"),
    "flux": (256, True, 0, 1000.0, "halves"),
    "transformer": (None, False, 0, 1.0, "interleaved"),
    "ldm": (None, True, 0, 1.0, "halves"),
}


def embedding(preset, timesteps, dim=None, max_period=10000.0):
    """The [N, dim] embedding in float64 (timesteps first become float32)."""
    default_dim, flip, shift, time_factor, layout = PRESETS[preset]
    dim = dim or default_dim
    t = np.asarray(timesteps, dtype=np.float32).astype(np.float64)
    t = t * time_factor
    half = dim // 2
    freqs = np.exp(-np.log(max_period) * np.arange(half) / (half - shift))
    angles = t[:, None] * freqs[None, :]
    sin, cos = np.sin(angles), np.cos(angles)
    first, second = (cos, sin) if flip else (sin, cos)
    if layout == "interleaved":
        out = np.empty((len(t), 2 * half))
        out[:, 0::2], out[:, 1::2] = first, second
    else:
        out = np.concatenate([first, second], axis=1)
    if dim % 2:
        out = np.pad(out, ((0, 0), (0, 1)))
    return out


def fp32_tolerance(preset, timesteps):
    """Per-row bound of the fp32 contract: 1e-6 + 5e-7 * |time_factor * t|."""
    time_factor = PRESETS[preset][3]
    t = np.asarray(timesteps, dtype=np.float32).astype(np.float64)
    return (1e-6 + 5e-7 * np.abs(time_factor * t))[:, None]


def to_bf16_bits(values):
    """float32 -> bfloat16 bit patterns, rounded to nearest even."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(
        np.uint64)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + rounding) >> 16).astype(np.uint16)
