#!/usr/bin/env python3
"""temb.local (the in-process engine) against diffusers'
get_timestep_embedding, in one process, on the CPU, one thread each (torch:
set_num_threads(1); temb: OMP_NUM_THREADS=1, and backend="cpu",
cpu_threads=1 explicitly).

Cases: a batch of 1 at 320 wide (SD 1.x, LDM convention) and 4096 x 1280
(LDM).  temb is measured three ways: numpy in and out; torch in and out
(return_tensors="pt", as a pipeline calls it); and the temb.torch.Timesteps
module against diffusers' Timesteps module (which adds the custom-op
dispatch on temb's side).  Not a timed test: numbers depend on the machine.

Usage: bench/local_engine_bench.py [--repeat 7] [--json]
    (run from a checkout after building; TEMB_LOCAL_EXTENSION_DIR=<build>/python
     if the build directory is not ./build)
Prints one line per case: median microseconds per call and the ratio
diffusers / temb (above 1: temb is faster).
"""
import os

os.environ["OMP_NUM_THREADS"] = "1"  # before torch and temb start threads

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import timeit  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from diffusers.models.embeddings import Timesteps as DiffusersTimesteps  # noqa: E402
from diffusers.models.embeddings import get_timestep_embedding  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python"))

import temb.local  # noqa: E402
import temb.torch  # noqa: E402


def per_call_us(fn, repeat):
    """Median over `repeat` rounds of the per-call time, in microseconds;
    each round runs about 0.2 s."""
    fn()
    number = 1
    while True:
        elapsed = timeit.timeit(fn, number=number)
        if elapsed > 0.2 or number >= 1 << 20:
            break
        number *= 2
    rounds = timeit.repeat(fn, number=number, repeat=repeat)
    return statistics.median(rounds) / number * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    temb.local.configure(backend="cpu", cpu_threads=1)
    engine = temb.local.default_engine()

    rows = []
    for batch, dim in ((1, 320), (4096, 1280)):
        rng = np.random.default_rng(0)
        t_np = (rng.random(batch) * 1000).astype(np.float32)
        t_pt = torch.from_numpy(t_np.copy())
        spec = dict(dim=dim, preset="ldm")

        def diffusers_fn():
            return get_timestep_embedding(t_pt, dim, flip_sin_to_cos=True,
                                          downscale_freq_shift=0)

        def temb_np():
            return temb.local.embed(t_np, **spec)

        def temb_pt():
            return temb.local.embed(t_pt, return_tensors="pt", **spec)

        theirs = DiffusersTimesteps(dim, True, 0)
        ours = temb.torch.Timesteps(dim, True, 0, client=temb.local)

        # Same convention, within the fp32 contract's bound (not bit-equal:
        # PyTorch's float32 exp is not correctly rounded).
        bound = 2 * (1e-6 + 5e-7 * 1000)
        want = diffusers_fn().numpy()
        for got in (temb_np(), temb_pt().numpy(), ours(t_pt).numpy()):
            assert got.shape == want.shape
            assert float(np.abs(got - want).max()) <= bound

        base = per_call_us(diffusers_fn, args.repeat)
        module_base = per_call_us(lambda: theirs(t_pt), args.repeat)
        for name, fn, reference in (
                ("temb.local.embed numpy", temb_np, base),
                ("temb.local.embed torch (pt)", temb_pt, base),
                ("temb.torch.Timesteps(client=temb.local)",
                 lambda: ours(t_pt), module_base)):
            us = per_call_us(fn, args.repeat)
            rows.append(dict(case=f"{batch}x{dim}", temb=name, temb_us=us,
                             diffusers_us=reference, ratio=reference / us))

    info = dict(device=engine.device, torch=torch.__version__,
                torch_threads=torch.get_num_threads())
    if args.json:
        print(json.dumps(dict(info, results=rows), indent=2))
        return
    print(f"temb: {info['device']}; torch {info['torch']} with "
          f"{info['torch_threads']} thread")
    print(f"{'case':>10}  {'temb path':42} {'temb us':>10} "
          f"{'diffusers us':>13} {'ratio':>7}")
    for row in rows:
        print(f"{row['case']:>10}  {row['temb']:42} {row['temb_us']:10.2f} "
              f"{row['diffusers_us']:13.2f} {row['ratio']:7.1f}x")
    print("diffusers us: get_timestep_embedding(t, dim, True, 0), or its "
          "Timesteps module for the module row")


if __name__ == "__main__":
    main()
