#!/usr/bin/env python3
"""`temb embed --local` writing a large .npy, whole process, against eager
PyTorch computing the same embedding in an already running process and
saving it with numpy (the import of torch is not counted).

Usage: bench/local_npy_bench.py [--rounds 5] [--rows 16384] [--dim 1280]
Prints one JSON object: medians in seconds and the ratio PyTorch / temb.
"""
import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from diffusers.models.embeddings import get_timestep_embedding

REPO = Path(__file__).resolve().parents[1]
TEMB = Path(os.environ.get("TEMB_BIN_DIR", REPO / "build" / "bin")) / "temb"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--dim", type=int, default=1280)
    args = parser.parse_args()
    torch.set_num_threads(1)
    timesteps = (np.arange(args.rows, dtype=np.float32) * 0.061).astype(
        np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        steps = Path(tmp) / "t.txt"
        steps.write_text(",".join(repr(float(t)) for t in timesteps))
        command = [str(TEMB), "embed", "--local", f"--dim={args.dim}",
                   "--flip_sin_to_cos", "--downscale_freq_shift=0",
                   f"--timesteps=@{steps}", "--format=npy"]
        temb_s, torch_s = [], []
        for _ in range(args.rounds):
            with open(os.devnull, "wb") as sink:
                start = time.perf_counter()
                subprocess.run(command, stdout=sink, check=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
                temb_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            emb = get_timestep_embedding(torch.from_numpy(timesteps), args.dim,
                                         flip_sin_to_cos=True,
                                         downscale_freq_shift=0)
            with open(os.devnull, "wb") as sink:
                np.save(sink, emb.numpy())
            torch_s.append(time.perf_counter() - start)
    result = {
        "shape": [args.rows, args.dim],
        "temb_local_whole_process_s": statistics.median(temb_s),
        "torch_in_process_s": statistics.median(torch_s),
    }
    result["ratio_torch_over_temb"] = (result["torch_in_process_s"] /
                                       result["temb_local_whole_process_s"])
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
