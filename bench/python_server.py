#!/usr/bin/env python3
"""The "what users would write instead" baseline: a Python grpcio server.

It implements temb.v1 EmbeddingService.Embed (so `temb bench` drives it
exactly like temb-server) and computes the embedding the way a diffusion
pipeline does, in float32 and PyTorch's op order, with numpy or, when it is
installed and --engine=torch, with eager PyTorch on the CPU.  It is a
baseline, not a product: it knows only the presets the suite uses and the
halves layout, and it trusts its input.

    python bench/python_server.py --port_file=/tmp/port [--engine=numpy]
"""

import argparse
import importlib
import math
import os
import signal
import sys
import tempfile
import threading
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np

REPO = Path(__file__).resolve().parents[1]

# name -> (dim, flip_sin_to_cos, downscale_freq_shift); the server's table.
PRESETS = {
    "sd15": (320, True, 0.0), "sd21": (320, True, 0.0),
    "sdxl": (320, True, 0.0), "dit": (256, True, 0.0),
    "ddpm": (128, False, 1.0), "flux": (256, True, 0.0),
}
# temb.v1.DType -> numpy dtype; bf16 is left out (numpy has none).
WIRE = {0: np.float32, 1: np.float32, 2: np.float16, 4: np.float64}


def load_stubs(out_dir):
    """Generates the temb.v1 Python modules with grpcio-tools, imports them."""
    from grpc_tools import protoc  # pylint: disable=import-outside-toplevel
    proto_dir = REPO / "proto"
    include = Path(protoc.__file__).parent / "_proto"
    rc = protoc.main(["protoc", f"-I{proto_dir}", f"-I{include}",
                      f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
                      str(proto_dir / "temb" / "v1" / "temb.proto")])
    if rc != 0:
        raise RuntimeError("protoc failed on temb.proto")
    # Regular packages first on the path, so that an installed temb client
    # package (also named temb) does not shadow them.
    for package in ("temb", "temb/v1"):
        (Path(out_dir) / package / "__init__.py").touch()
    sys.path.insert(0, str(out_dir))
    return (importlib.import_module("temb.v1.temb_pb2"),
            importlib.import_module("temb.v1.temb_pb2_grpc"))


def numpy_embedding(t, dim, flip, shift, max_period):
    half = dim // 2
    exponent = (np.float32(-math.log(max_period)) *
                np.arange(half, dtype=np.float32)) / np.float32(half - shift)
    angles = t[:, None] * np.exp(exponent)[None, :]
    sin, cos = np.sin(angles), np.cos(angles)
    parts = [cos, sin] if flip else [sin, cos]
    if dim % 2:
        parts.append(np.zeros((t.shape[0], 1), np.float32))
    return np.concatenate(parts, axis=1)


def torch_embedding(torch):
    def embed(t, dim, flip, shift, max_period):
        half = dim // 2
        exponent = -math.log(max_period) * torch.arange(
            half, dtype=torch.float32) / (half - shift)
        angles = torch.from_numpy(t)[:, None] * torch.exp(exponent)[None, :]
        parts = ([torch.cos(angles), torch.sin(angles)] if flip
                 else [torch.sin(angles), torch.cos(angles)])
        if dim % 2:
            parts.append(torch.zeros(t.shape[0], 1))
        return torch.cat(parts, dim=-1).numpy()
    return embed


def make_servicer(pb, pb_grpc, compute):
    class Servicer(pb_grpc.EmbeddingServiceServicer):
        def Embed(self, request, context):
            dim, flip, shift = PRESETS.get(request.preset, (0, True, 0.0))
            spec = request.spec
            if spec.HasField("dim"):
                dim = spec.dim
            if spec.HasField("flip_sin_to_cos"):
                flip = spec.flip_sin_to_cos
            if spec.HasField("downscale_freq_shift"):
                shift = spec.downscale_freq_shift
            max_period = spec.max_period if spec.HasField("max_period") else 1e4
            if dim < 2 or request.dtype not in WIRE:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              "unsupported request for the baseline")
            t = np.asarray(request.timesteps or request.integer_timesteps,
                           dtype=np.float32)
            emb = compute(t, dim, flip, shift, max_period)
            out = emb.astype(WIRE[request.dtype], copy=False)
            return pb.EmbedResponse(
                request_id=request.request_id, backend="python",
                embedding=pb.Tensor(shape=[t.shape[0], dim],
                                    dtype=request.dtype or 1,
                                    data=out.tobytes()))
    return Servicer()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:0")
    parser.add_argument("--port_file", default="")
    parser.add_argument("--workers", type=int, default=8,
                        help="handler threads (grpcio's thread pool)")
    parser.add_argument("--engine", choices=("numpy", "torch"),
                        default="numpy")
    args = parser.parse_args()

    if args.engine == "torch":
        import torch  # pylint: disable=import-outside-toplevel
        torch.set_num_threads(1)
        compute = torch_embedding(torch)
    else:
        compute = numpy_embedding

    with tempfile.TemporaryDirectory() as stubs:
        pb, pb_grpc = load_stubs(stubs)
        limit = (256 << 20) + (1 << 20)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=args.workers),
            options=[("grpc.max_send_message_length", limit),
                     ("grpc.max_receive_message_length", limit)])
        pb_grpc.add_EmbeddingServiceServicer_to_server(
            make_servicer(pb, pb_grpc, compute), server)
        port = server.add_insecure_port(args.address)
        server.start()
        if args.port_file:
            tmp = args.port_file + ".tmp"
            Path(tmp).write_text(f"{port}\n")
            os.replace(tmp, args.port_file)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        server.stop(grace=1).wait()


if __name__ == "__main__":
    main()
