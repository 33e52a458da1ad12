#!/usr/bin/env python3
"""The Triton baseline: a real Triton Inference Server (2.51, bundled by
nvidia-pytriton 0.7.0) serving the LDM / Stable Diffusion timestep
embedding as model `sd15` (dim 320, [cos | sin], shift 0), computed with
numpy, with the same signature as temb's: input TIMESTEP FP32 [-1, 1],
output EMBEDDING FP32 [-1, 320], max_batch_size as temb's --max_batch.
PyTriton turns dynamic batching on with batching; the queue delay is 0, so
Triton only merges requests that are already waiting (temb never merges).

Run it from a venv with nvidia-pytriton==0.7.0 (not the project's .venv):

  python3 -m venv /tmp/triton-venv
  /tmp/triton-venv/bin/pip install nvidia-pytriton==0.7.0
  LD_LIBRARY_PATH=$(python3 -c 'import sysconfig; \\
      print(sysconfig.get_config_var("LIBDIR"))') \\
  /tmp/triton-venv/bin/python bench/triton/pytriton_server.py \\
      --http-port 8000 --grpc-port 8001

LD_LIBRARY_PATH matters with a pyenv Python: Triton's Python backend stub
otherwise loads Debian's libpython and fails with "'_thread.RLock' object
has no attribute '_recursion_count'".
"""

import argparse
import logging

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

DIM = 320
MAX_PERIOD = 10000.0


def ldm_embedding(t, dim=DIM):
    """diffusers get_timestep_embedding(t, dim, flip_sin_to_cos=True,
    downscale_freq_shift=0) in float32 numpy."""
    half = dim // 2
    exponent = (-np.log(np.float32(MAX_PERIOD)) *
                np.arange(half, dtype=np.float32)) / np.float32(half)
    freqs = np.exp(exponent).astype(np.float32)
    angles = t.astype(np.float32).reshape(-1, 1) * freqs[None, :]
    return np.concatenate([np.cos(angles), np.sin(angles)],
                          axis=1).astype(np.float32)


@batch
def infer(TIMESTEP):  # noqa: N803  (the tensor's name)
    return {"EMBEDDING": ldm_embedding(TIMESTEP)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--max-batch", type=int, default=65536)
    parser.add_argument("--instances", type=int, default=1,
                        help="model instances (Python processes)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    config = TritonConfig(http_port=args.http_port, grpc_port=args.grpc_port,
                          metrics_port=args.metrics_port)
    # PyTriton guards statistics (and more) behind a generated token by
    # default; perf_analyzer reads statistics, as it does from temb.
    security = TritonSecurityConfig(restricted_endpoints=[
        "shared-memory", "model-repository", "trace", "logging"])
    with Triton(config=config, security_config=security) as triton:
        triton.bind(
            model_name="sd15",
            infer_func=[infer] * args.instances,
            inputs=[Tensor(name="TIMESTEP", dtype=np.float32, shape=(1,))],
            outputs=[Tensor(name="EMBEDDING", dtype=np.float32,
                            shape=(DIM,))],
            config=ModelConfig(
                max_batch_size=args.max_batch,
                batcher=DynamicBatcher(max_queue_delay_microseconds=0)),
            strict=True)
        triton.serve()


if __name__ == "__main__":
    main()
