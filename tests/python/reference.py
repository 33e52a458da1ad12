"""A float64 numpy evaluation of the embedding contract (the README's
"What temb computes"), written from the formulas, independent of the server."""

import numpy as np


def embedding(timesteps, dim, *, flip_sin_to_cos, downscale_freq_shift,
              max_period=10000.0, scale=1.0, time_factor=1.0,
              repeat_only=False, layout="halves"):
    # Timesteps travel as float32: round them the same way first.
    t = np.asarray(timesteps, dtype=np.float32).astype(np.float64).reshape(-1)
    if repeat_only:
        return np.repeat(t[:, None], dim, axis=1)
    half = dim // 2
    i = np.arange(half, dtype=np.float64)
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


def fp32_bound(timesteps, scale=1.0, time_factor=1.0):
    """The guide's accuracy bound for the fp32 path, per row: 1e-6 +
    5e-7 * |scale * t| (t after time_factor), as a column vector."""
    t = np.asarray(timesteps, dtype=np.float32).astype(np.float64).reshape(-1)
    return (1e-6 + 5e-7 * np.abs(scale * time_factor * t))[:, None]


def to_bf16_bits(values):
    """float32 -> bfloat16 bit patterns, round to nearest even (finite input)."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + rounding) >> 16).astype(np.uint16)


def bf16_bits_to_float32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
