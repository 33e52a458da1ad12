#!/usr/bin/env python3
"""Time conditioning on a GPU at Qwen-Image's real width: temb's cuBLASLt
path (`temb condition --device=cuda`) against diffusers' own modules on the
same GPU, bit for bit and in time.

The slice is qwen_image_bench.py's (4 of 60 blocks at D 3072, random bf16
conditioning weights, 942 MiB).  For a 50-step plan:

  bits      every output (temb, each block's img_mod and txt_mod, norm_out)
            of temb on the GPU against diffusers' modules on the GPU run step
            by step as the pipeline runs them (bf16, cuBLAS), and against
            temb on the CPU: the share of bit-equal elements, the share
            within one bf16 ulp, and the largest gap over the output's
            largest magnitude
  time      medians over --rounds rounds, alternating, each the median of
            --repeat calls:
              read      a plain read of the weight bytes on the GPU (a sum
                        of their 64-bit words)
              temb 1    `temb condition --device=cuda`, one timestep, row
                        cache off (inputs up, outputs down included)
              temb 50   the same for the 50-step plan in one call
              cublas 50 the same Linears for 50 rows as PyTorch bf16
                        F.linear on the GPU (cuBLAS), synchronised
              diffusers 50  diffusers' modules on the GPU, step by step

usage: conditioning_gpu.py --temb build/bin/temb [--rounds 3] [--json F]
       (--device cpu rehearses the script where no GPU is: every "cuda"
       above is then the CPU)
"""
import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import qwen_image_bench as slice_bench  # noqa: E402

STEPS = slice_bench.STEPS


def diffusers_outputs(model, timesteps, device):
    """Every conditioning output of diffusers' modules, one step at a time
    as the pipeline calls them (timestep / 1000 in bf16), stacked as temb
    writes them."""
    hidden = torch.zeros(1, 1, model.inner_dim, dtype=torch.bfloat16,
                         device=device)
    rows = {"temb": [], "img_mod": [], "txt_mod": [], "norm_out": []}
    for t in timesteps:
        timestep = torch.tensor([t / 1000], dtype=torch.bfloat16,
                                device=device)
        temb = model.time_text_embed(timestep, hidden)
        rows["temb"].append(temb[0])
        rows["img_mod"].append(torch.stack(
            [block.img_mod(temb)[0] for block in model.transformer_blocks]))
        rows["txt_mod"].append(torch.stack(
            [block.txt_mod(temb)[0] for block in model.transformer_blocks]))
        rows["norm_out"].append(
            model.norm_out.linear(model.norm_out.silu(temb))[0])
    return {name: torch.stack(values).cpu() for name, values in rows.items()}


def compare(ours, reference):
    """{output: (bit-equal share, share within one bf16 ulp of the
    reference value, largest gap over the output's largest magnitude)}."""
    found = {}
    for name, expected in reference.items():
        got = ours[name].to(torch.bfloat16).reshape(expected.shape).float()
        want = expected.float()
        equal = got.view(torch.int32) == want.view(torch.int32)
        # One ulp of a bf16 value v in [2^e, 2^(e+1)) is 2^(e-7).
        exponent = torch.frexp(want.abs().clamp_min(2.0**-126))[1]
        ulp = torch.ldexp(torch.ones_like(want), exponent - 8)
        gap = (got - want).abs()
        found[name] = (equal.float().mean().item(),
                       (gap <= ulp).float().mean().item(),
                       (gap.max() / want.abs().max()).item())
    return found


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_ms(repeat, run):
    times = []
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        run()
        sync()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temb", required=True, help="the temb binary")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("conditioning_gpu.py needs a CUDA GPU "
                         "(--device cpu rehearses it)")
    plan = [1000.0 * (1 - i / STEPS) for i in range(STEPS)]
    gpu = torch.cuda.get_device_name() if device == "cuda" else "no GPU"
    cpu, commit = slice_bench.machine()
    # scripts/gpu-check.sh names the commit its binaries were built at: a
    # GPU machine's copy of the tree may carry no history of its own.
    commit = os.environ.get("BENCH_COMMIT", commit)
    with tempfile.TemporaryDirectory() as scratch_name, torch.no_grad():
        scratch = pathlib.Path(scratch_name)
        folder = scratch / "qwen_image_slice"
        folder.mkdir()
        model, tensors = slice_bench.make_slice(folder)
        gpu_tensors = {k: v.to(device) for k, v in tensors.items()}
        slice_bench.load_slice(model, gpu_tensors)
        weight_bytes = sum(t.numel() * t.element_size()
                           for t in tensors.values())
        print(f"Qwen-Image-shaped slice: D {model.inner_dim}, "
              f"{slice_bench.LAYERS} of 60 blocks, {weight_bytes / 2**20:.0f} "
              f"MiB of bf16 conditioning weights; {gpu}; {cpu}; commit "
              f"{commit}; "
              f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}"
              " UTC", flush=True)

        # Bits.
        loaded = slice_bench.temb_condition(
            args.temb, folder, plan, scratch / "gpu.safetensors",
            f"--device={device}").splitlines()[0]
        print("temb condition --device=" + device + ": " + loaded, flush=True)
        slice_bench.temb_condition(args.temb, folder, plan,
                                   scratch / "cpu.safetensors", "--device=cpu")
        on_gpu = load_file(str(scratch / "gpu.safetensors"))
        on_cpu = load_file(str(scratch / "cpu.safetensors"))
        reference = diffusers_outputs(model, plan, device)
        bits = {"temb cuda vs diffusers cuda": compare(on_gpu, reference),
                "temb cpu vs diffusers cuda": compare(on_cpu, reference),
                "temb cuda vs temb cpu": compare(
                    on_gpu, {k: v.to(torch.bfloat16)
                             for k, v in on_cpu.items()})}
        for what, found in bits.items():
            print(what + ": " + ", ".join(
                f"{name} {equal:.3%} equal, {ulp:.3%} within 1 ulp, largest "
                f"gap {gap:.1e} of its largest value"
                for name, (equal, ulp, gap) in found.items()), flush=True)

        # Time.
        flat = torch.cat([t.reshape(-1).view(torch.uint8)
                          for t in gpu_tensors.values()])
        words = flat[:flat.numel() // 8 * 8].view(torch.int64)
        F = torch.nn.functional
        prefixes = sorted({k[:-len(".weight")] for k in gpu_tensors
                           if k.endswith(".weight")})
        inputs = {p: torch.randn(STEPS, gpu_tensors[p + ".weight"].shape[1],
                                 device=device).to(torch.bfloat16)
                  for p in prefixes}

        def cublas50():
            for p in prefixes:
                F.linear(inputs[p], gpu_tensors[p + ".weight"],
                         gpu_tensors[p + ".bias"])

        def temb_ms(timesteps):
            return statistics.median(slice_bench.run_times(
                slice_bench.temb_condition(
                    args.temb, folder, timesteps, scratch / "t.safetensors",
                    f"--device={device}", f"--repeat={args.repeat}")))

        results = {k: [] for k in ("read", "temb1", "temb50", "cublas50",
                                   "diffusers50")}
        for round_index in range(args.rounds):
            results["read"].append(median_ms(args.repeat, words.sum))
            results["temb1"].append(temb_ms(plan[STEPS // 2:STEPS // 2 + 1]))
            results["cublas50"].append(median_ms(args.repeat, cublas50))
            results["temb50"].append(temb_ms(plan))
            results["diffusers50"].append(median_ms(
                max(1, args.repeat // 2),
                lambda: diffusers_outputs(model, plan, device)))
            print(f"round {round_index + 1}: " + ", ".join(
                f"{k} {v[-1]:.2f} ms" for k, v in results.items()),
                flush=True)
        median = {k: statistics.median(v) for k, v in results.items()}
        gb = weight_bytes / 1e9
        for key in ("read", "temb1", "temb50", "cublas50", "diffusers50"):
            print(f"{key:12s} {median[key]:8.2f} ms  "
                  f"{gb / median[key] * 1e3:7.1f} GB/s of weights")
        print(f"temb 50 = {median['cublas50'] / median['temb50']:.2f}x "
              f"cuBLAS's speed for the same Linears, "
              f"{median['diffusers50'] / median['temb50']:.1f}x diffusers "
              "step by step")
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps({
                "gpu": gpu, "cpu": cpu, "commit": commit, "temb": loaded,
                "weight_bytes": weight_bytes, "rounds": results,
                "bits": bits}, indent=1))


if __name__ == "__main__":
    main()
