#!/usr/bin/env python3
"""Time conditioning on the CPU: `temb condition` against the same chain of
PyTorch bf16 Linears, on a FLUX.1-dev-shaped slice with random weights.

The slice has the released width (D=3072, pooled 768) and the t, guidance and
text embedders, but only --double/--single blocks (default 2 and 4: 746 MiB
of bf16 weights), so it fits a small machine; the cost of the full model is
the slice's times the ratio of weight bytes.  Both sides read every weight
once per call and compute all outputs for N rows; temb's times are its own
per-call timings (--repeat, row cache off), PyTorch's the same work timed
in process.  Prints one line per N with the best and median of --runs.

usage: conditioning_bench.py --temb build/bin/temb [--rows 1,16] [--threads 2]
"""
import argparse
import json
import pathlib
import re
import statistics
import subprocess
import tempfile
import time

import numpy as np
import torch
from safetensors.torch import load_file, save_file

WIDTH, POOLED = 3072, 768


def make_slice(folder, double, single):
    generator = torch.Generator().manual_seed(0)
    tensors = {}

    def linear(prefix, out_features, in_features):
        tensors[prefix + ".weight"] = (
            torch.randn(out_features, in_features, generator=generator) /
            in_features ** 0.5).to(torch.bfloat16)
        tensors[prefix + ".bias"] = (
            torch.randn(out_features, generator=generator) * 0.01).to(
                torch.bfloat16)

    for name, width in (("timestep_embedder", 256), ("guidance_embedder", 256),
                        ("text_embedder", POOLED)):
        linear(f"time_text_embed.{name}.linear_1", WIDTH, width)
        linear(f"time_text_embed.{name}.linear_2", WIDTH, WIDTH)
    for block in range(double):
        linear(f"transformer_blocks.{block}.norm1.linear", 6 * WIDTH, WIDTH)
        linear(f"transformer_blocks.{block}.norm1_context.linear", 6 * WIDTH,
               WIDTH)
    for block in range(single):
        linear(f"single_transformer_blocks.{block}.norm.linear", 3 * WIDTH,
               WIDTH)
    linear("norm_out.linear", 2 * WIDTH, WIDTH)
    save_file(tensors, str(folder / "diffusion_pytorch_model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "_class_name": "FluxTransformer2DModel", "num_layers": double,
        "num_single_layers": single, "attention_head_dim": 128,
        "num_attention_heads": WIDTH // 128,
        "pooled_projection_dim": POOLED, "guidance_embeds": True}))
    return sum(t.numel() * 2 for t in tensors.values())


def time_temb(binary, folder, rows, threads, runs, scratch):
    pooled = scratch / f"pooled{rows}.npy"
    np.save(pooled, np.random.RandomState(0).randn(rows, POOLED)
            .astype(np.float32))
    timesteps = ",".join(str(1000 - 37.5 * i) for i in range(rows))
    done = subprocess.run(
        [binary, "condition", f"--model_dir={folder}",
         f"--timesteps={timesteps}", "--guidance=3.5", f"--pooled={pooled}",
         f"--out={scratch / 'out.safetensors'}", f"--threads={threads}",
         f"--repeat={runs}", "--cache_mib=0"],
        capture_output=True, text=True, check=True)
    return [float(ms) for ms in re.findall(r"run \d+: ([0-9.]+) ms",
                                           done.stderr)]


def time_torch(folder, rows, threads, runs):
    torch.set_num_threads(threads)
    weights = load_file(str(folder / "diffusion_pytorch_model.safetensors"))
    F = torch.nn.functional

    def mlp(prefix, x):
        return F.linear(F.silu(F.linear(x, weights[prefix + ".linear_1.weight"],
                                        weights[prefix + ".linear_1.bias"])),
                        weights[prefix + ".linear_2.weight"],
                        weights[prefix + ".linear_2.bias"])

    blocks = sorted({k[:-len(".weight")] for k in weights
                     if k.endswith(".weight") and "time_text_embed" not in k})
    sinus = torch.randn(rows, 256).to(torch.bfloat16)
    pooled = torch.randn(rows, POOLED).to(torch.bfloat16)
    times = []
    with torch.no_grad():
        for _ in range(runs):
            start = time.perf_counter()
            temb = (mlp("time_text_embed.timestep_embedder", sinus) +
                    mlp("time_text_embed.guidance_embedder", sinus) +
                    mlp("time_text_embed.text_embedder", pooled))
            silu = F.silu(temb)
            for block in blocks:
                F.linear(silu, weights[block + ".weight"],
                         weights[block + ".bias"])
            times.append((time.perf_counter() - start) * 1000)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temb", required=True, help="the temb binary")
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--double", type=int, default=2)
    parser.add_argument("--single", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = pathlib.Path(scratch_name)
        folder = scratch / "flux_slice"
        folder.mkdir()
        weight_bytes = make_slice(folder, args.double, args.single)
        print(f"FLUX.1-dev-shaped slice: {args.double} double + {args.single} "
              f"single blocks, {weight_bytes / 2**20:.0f} MiB bf16, "
              f"{args.threads} threads")
        for rows in (int(r) for r in args.rows.split(",")):
            ours = time_temb(args.temb, folder, rows, args.threads, args.runs,
                             scratch)
            theirs = time_torch(folder, rows, args.threads, args.runs)
            print(f"rows {rows:3d}: temb best {min(ours):8.1f} ms median "
                  f"{statistics.median(ours):8.1f} ms | PyTorch best "
                  f"{min(theirs):8.1f} ms median "
                  f"{statistics.median(theirs):8.1f} ms")


if __name__ == "__main__":
    main()
