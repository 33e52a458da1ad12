#!/usr/bin/env python3
"""Time conditioning on the CPU at Qwen-Image's real width, all in one run:
temb against a plain read of the same weight bytes, against the best GEMM on
the machine, and against diffusers' own modules run step by step.

The slice is a diffusers folder: config.json of a QwenImageTransformer2DModel
with num_layers=4 (of the released 60) at the released width (D 3072, 6D
18432), and a safetensors file with its conditioning tensors (random bf16;
temb reads no other tensor).  Measured, alternating the contenders in each of
--rounds rounds, each time the median of --repeat calls:

  read      a plain sequential read of the same weight bytes (a sum of their
            64-bit words by PyTorch on --threads threads)
  temb 1    `temb condition` for one timestep (row cache off): one step
  temb 50   the same for a 50-step plan in one call
  gemm 50   the same Linears (time MLP, every block's img_mod and txt_mod,
            norm_out) for 50 rows as PyTorch bf16 F.linear, which calls
            oneDNN's bf16 GEMM
  diffusers 50  diffusers' own modules (time_text_embed, each block's
            img_mod and txt_mod, norm_out) run in eager PyTorch for each of
            the 50 steps, as the pipeline runs them

and prints the medians over rounds and the three ratios of the issue:
read/temb 1 (goal >= 0.8), gemm 50/temb 50 (>= 0.7), diffusers 50/temb 50
(>= 5).

With --baseline OTHER_TEMB (another build of temb, e.g. the commit before a
change), that binary's one step and 50-step plan are timed too, alternated
with temb's in each round, and the before/after ratios are printed.

usage: qwen_image_bench.py --temb build/bin/temb [--threads 2] [--rounds 5]
                           [--baseline OTHER_TEMB]
"""
import argparse
import datetime
import json
import pathlib
import platform
import re
import statistics
import subprocess
import tempfile
import time

import torch
from safetensors.torch import save_file

LAYERS = 4
STEPS = 50


def conditioning_tensors(config, generator):
    """Random bf16 weights for every conditioning Linear of the model."""
    width = config["num_attention_heads"] * config["attention_head_dim"]
    shapes = {
        "time_text_embed.timestep_embedder.linear_1": (width, 256),
        "time_text_embed.timestep_embedder.linear_2": (width, width),
        "norm_out.linear": (2 * width, width),
    }
    for block in range(config["num_layers"]):
        for mod in ("img_mod", "txt_mod"):
            shapes[f"transformer_blocks.{block}.{mod}.1"] = (6 * width, width)
    tensors = {}
    for prefix, (out_features, in_features) in shapes.items():
        tensors[prefix + ".weight"] = (
            torch.randn(out_features, in_features, generator=generator) /
            in_features ** 0.5).to(torch.bfloat16)
        tensors[prefix + ".bias"] = (
            torch.randn(out_features, generator=generator) * 0.01).to(
                torch.bfloat16)
    return tensors


def make_slice(folder):
    """The folder temb loads, and diffusers' own conditioning modules holding
    the same weights (the rest of the model stays on the meta device)."""
    from diffusers import QwenImageTransformer2DModel
    with torch.device("meta"):
        model = QwenImageTransformer2DModel(num_layers=LAYERS)
    model.save_config(str(folder))
    tensors = conditioning_tensors(dict(model.config),
                                   torch.Generator().manual_seed(0))
    save_file(tensors, str(folder / "diffusion_pytorch_model.safetensors"))
    load_slice(model, tensors)
    return model, tensors


def load_slice(model, tensors):
    """Puts the slice's tensors (on whatever device they are) into
    diffusers' conditioning modules of `model`."""
    def load(module, prefix):
        module.load_state_dict(
            {key[len(prefix):]: value for key, value in tensors.items()
             if key.startswith(prefix)}, assign=True)

    load(model.time_text_embed, "time_text_embed.")
    load(model.norm_out, "norm_out.")
    for block in range(LAYERS):
        for mod in ("img_mod", "txt_mod"):
            load(getattr(model.transformer_blocks[block], mod),
                 f"transformer_blocks.{block}.{mod}.")


def temb_condition(binary, folder, timesteps, out, *flags):
    """`temb condition` of the slice with the row cache off; its stderr."""
    done = subprocess.run(
        [binary, "condition", f"--model_dir={folder}",
         "--timesteps=" + ",".join(f"{t:.6f}" for t in timesteps),
         f"--out={out}", "--cache_mib=0", *flags],
        capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"temb condition {' '.join(flags)}: {done.stderr}")
    return done.stderr


def run_times(stderr):
    """The milliseconds of each `--repeat` run that `temb condition`
    reported."""
    return [float(ms) for ms in re.findall(r"run \d+: ([0-9.]+) ms", stderr)]


def temb_times(binary, folder, timesteps, threads, repeat, scratch):
    return run_times(temb_condition(
        binary, folder, timesteps, scratch / "out.safetensors",
        f"--threads={threads}", f"--repeat={repeat}"))


def median_ms(repeat, run):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def gemm_chain(tensors, rows):
    """The same Linears for `rows` rows, one bf16 F.linear each."""
    F = torch.nn.functional
    prefixes = sorted({k[:-len(".weight")] for k in tensors
                       if k.endswith(".weight")})
    inputs = {p: torch.randn(rows, tensors[p + ".weight"].shape[1]).to(
        torch.bfloat16) for p in prefixes}

    def run():
        for p in prefixes:
            F.linear(inputs[p], tensors[p + ".weight"], tensors[p + ".bias"])
    return run


def diffusers_steps(model, timesteps):
    """The conditioning part of the model's forward, one step at a time, as
    the pipeline calls it (timestep / 1000, bf16)."""
    hidden = torch.zeros(1, 1, model.inner_dim, dtype=torch.bfloat16)

    def run():
        for t in timesteps:
            timestep = torch.tensor([t / 1000], dtype=torch.bfloat16)
            temb = model.time_text_embed(timestep, hidden)
            for block in model.transformer_blocks:
                block.img_mod(temb)
                block.txt_mod(temb)
            model.norm_out(hidden, temb)
    return run


def machine():
    model = "unknown CPU"
    for line in subprocess.run(["lscpu"], capture_output=True,
                               text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True,
                            cwd=pathlib.Path(__file__).parent).stdout.strip()
    return model, commit


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temb", required=True, help="the temb binary")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--baseline",
                        help="another temb binary timed alternately")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # A FlowMatch-like plan from 1000 down; any 50 distinct values do.
    plan = [1000.0 * (1 - i / STEPS) for i in range(STEPS)]
    with tempfile.TemporaryDirectory() as scratch_name, torch.no_grad():
        scratch = pathlib.Path(scratch_name)
        folder = scratch / "qwen_image_slice"
        folder.mkdir()
        model, tensors = make_slice(folder)
        weight_bytes = sum(t.numel() * t.element_size()
                           for t in tensors.values())
        flat = torch.cat([t.reshape(-1).view(torch.uint8)
                          for t in tensors.values()])
        words = flat[:flat.numel() // 8 * 8].view(torch.int64)
        gemm50 = gemm_chain(tensors, STEPS)
        steps50 = diffusers_steps(model, plan)
        cpu, commit = machine()
        print(f"Qwen-Image-shaped slice: D {model.inner_dim}, {LAYERS} of 60 "
              f"blocks, {weight_bytes / 2**20:.0f} MiB of bf16 conditioning "
              f"weights; {args.threads} threads; {cpu}, {platform.machine()}; "
              f"commit {commit}; "
              f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} "
              "UTC")
        results = {k: [] for k in ("read", "temb1", "temb50", "gemm50",
                                   "diffusers50")}
        if args.baseline:
            results.update(base1=[], base50=[])
        for round_index in range(args.rounds):
            results["read"].append(median_ms(args.repeat, words.sum))
            results["temb1"].append(statistics.median(temb_times(
                args.temb, folder, plan[STEPS // 2:STEPS // 2 + 1],
                args.threads, args.repeat, scratch)))
            results["gemm50"].append(median_ms(args.repeat, gemm50))
            results["temb50"].append(statistics.median(temb_times(
                args.temb, folder, plan, args.threads, args.repeat, scratch)))
            results["diffusers50"].append(median_ms(max(1, args.repeat // 2),
                                                    steps50))
            if args.baseline:
                results["base1"].append(statistics.median(temb_times(
                    args.baseline, folder, plan[STEPS // 2:STEPS // 2 + 1],
                    args.threads, args.repeat, scratch)))
                results["base50"].append(statistics.median(temb_times(
                    args.baseline, folder, plan, args.threads, args.repeat,
                    scratch)))
            print(f"round {round_index + 1}: " + ", ".join(
                f"{k} {v[-1]:.1f} ms" for k, v in results.items()),
                flush=True)
        median = {k: statistics.median(v) for k, v in results.items()}
        gb = weight_bytes / 1e9
        print(f"read      {median['read']:8.1f} ms  {gb / median['read'] * 1e3:5.1f} GB/s")
        print(f"temb 1    {median['temb1']:8.1f} ms  {gb / median['temb1'] * 1e3:5.1f} GB/s"
              f"  = {median['read'] / median['temb1']:.2f}x the read (goal >= 0.8)")
        print(f"temb 50   {median['temb50']:8.1f} ms")
        print(f"gemm 50   {median['gemm50']:8.1f} ms"
              f"  temb = {median['gemm50'] / median['temb50']:.2f}x its speed (goal >= 0.7)")
        print(f"diffusers {median['diffusers50']:8.1f} ms"
              f"  temb = {median['diffusers50'] / median['temb50']:.1f}x faster (goal >= 5)")
        if args.baseline:
            for steps in ("1", "50"):
                base, now = median["base" + steps], median["temb" + steps]
                print(f"baseline {steps:>2} {base:8.1f} ms  temb = "
                      f"{base / now:.2f}x the baseline's speed")
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps({
                "cpu": cpu, "commit": commit, "threads": args.threads,
                "baseline": args.baseline,
                "weight_bytes": weight_bytes, "rounds": results}, indent=1))


if __name__ == "__main__":
    main()
