#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_kernel_api into corpus/kernel_api/.

The byte layout is the one kernel_api_fuzzer.cc documents.  Seeds cover each
family of the numerical contract, every dtype, layout, precision and CPU
engine slot, the edge cases (odd dim, dim 1, empty batch, t = 0) and a few
requests that validation must reject.  Run it after changing the layout:
    python3 fuzz/make_kernel_seeds.py
"""
import math
import pathlib
import struct

DTYPES = {"fp32": 0, "fp16": 1, "bf16": 2, "fp64": 3}


def seed(dim, timesteps, *, flip=True, repeat_only=False, interleaved=False,
         fp64_precision=False, dtype="fp32", engine=0, max_period=10000.0,
         shift=0.0, scale=1.0, time_factor=1.0, slope_first=False):
    flags = (int(flip) | int(repeat_only) << 1 | int(interleaved) << 2 |
             int(fp64_precision) << 3 | DTYPES[dtype] << 4 | engine << 6)
    more_flags = int(slope_first)
    header = struct.pack("<hBB4d", dim, flags, more_flags, max_period, shift,
                         scale, time_factor)
    return header + struct.pack(f"<{len(timesteps)}f", *timesteps)


SEEDS = {
    "ldm_320": seed(320, [0.0, 1.0, 500.5, 999.0]),
    "ddpm_odd_dim": seed(7, [10.5, -3.0], flip=False, shift=1.0, engine=1),
    "flux_bf16": seed(256, [0.0, 0.5, 1.0], time_factor=1000.0,
                      dtype="bf16", engine=2),
    "transformer_fp16": seed(64, [0.0, 1.0, 2.0, 1000.0], flip=False,
                             interleaved=True, max_period=100.0,
                             dtype="fp16", engine=3),
    "repeat_only_fp16": seed(5, [1.0, 65504.0, -2.5], repeat_only=True,
                             dtype="fp16"),
    "fp64_precision": seed(9, [999.0, 1e4, -1e6], fp64_precision=True,
                           dtype="fp64", engine=3),
    "dim_one": seed(1, [0.0, 3.0]),
    "empty_batch": seed(16, []),
    "scaled_shifted": seed(32, [0.25, 7.0], scale=2.5, shift=0.5, engine=1),
    "large_batch": seed(256, [float(t) for t in range(600)], engine=2),
    "longcat_slope_first": seed(256, [0.0, 0.25, 0.999], flip=False,
                                shift=1.0, time_factor=1000.0,
                                slope_first=True, dtype="bf16", engine=1),
    "slope_first_fp64": seed(33, [1.0, 999.0], flip=False, shift=1.0,
                             slope_first=True, fp64_precision=True,
                             dtype="fp64", engine=3),
    "reject_zero_divisor": seed(2, [1.0], shift=1.0),
    "reject_nan_timestep": seed(8, [1.0, math.nan]),
    "reject_dim_limit": seed(8192, [1.0]),
}


def main():
    out = pathlib.Path(__file__).resolve().parent / "corpus" / "kernel_api"
    out.mkdir(parents=True, exist_ok=True)
    for name, data in SEEDS.items():
        (out / f"{name}.bin").write_bytes(data)


if __name__ == "__main__":
    main()
