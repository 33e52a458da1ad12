#!/usr/bin/env python3
"""Two builds of temb, one step and a 50-step plan on the Qwen-Image slice
(bench/qwen_image_bench.py's folder: D 3072, 4 blocks, 920 MiB of bf16
conditioning weights), timed in alternating pairs: A then B, B then A, and
so on, each run `temb condition --repeat=R` with the row cache off, whose
per-run times exclude the load.  A pair's ratio B/A is taken from runs a
few seconds apart, so a machine's drift cancels; the median of the ratios
and its spread are printed, with each build's median time.

usage: condition_ab.py --a OLD_TEMB --b NEW_TEMB [--pairs 10] [--repeat 5]
                       [--threads 2] [--json FILE]
"""
import argparse
import json
import pathlib
import statistics
import tempfile

import torch

from qwen_image_bench import STEPS, machine, make_slice, temb_times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="the baseline temb")
    parser.add_argument("--b", required=True, help="the temb measured")
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    plan = [1000.0 * (1 - i / STEPS) for i in range(STEPS)]
    cases = {"1 step": plan[STEPS // 2:STEPS // 2 + 1], "50 steps": plan}
    with tempfile.TemporaryDirectory() as scratch_name, torch.no_grad():
        scratch = pathlib.Path(scratch_name)
        folder = scratch / "qwen_image_slice"
        folder.mkdir()
        make_slice(folder)
        cpu, commit = machine()
        print(f"Qwen-Image slice, {args.threads} threads, {cpu}, "
              f"commit {commit}; A {args.a}, B {args.b}")
        results = {}
        for case, timesteps in cases.items():
            times = {"a": [], "b": []}
            ratios = []
            for pair in range(args.pairs):
                order = ("a", "b") if pair % 2 == 0 else ("b", "a")
                got = {}
                for which in order:
                    got[which] = statistics.median(temb_times(
                        getattr(args, which), folder, timesteps,
                        args.threads, args.repeat, scratch))
                    times[which].append(got[which])
                ratios.append(got["a"] / got["b"])
            results[case] = {"a_ms": times["a"], "b_ms": times["b"],
                             "speed_b_over_a": ratios}
            print(f"{case:>8}: A {statistics.median(times['a']):7.1f} ms, "
                  f"B {statistics.median(times['b']):7.1f} ms; B's speed "
                  f"{statistics.median(ratios):.3f}x A's (pairs "
                  f"{min(ratios):.3f}..{max(ratios):.3f})", flush=True)
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(
                {"cpu": cpu, "commit": commit, "threads": args.threads,
                 "a": args.a, "b": args.b, "results": results}, indent=1))


if __name__ == "__main__":
    main()
