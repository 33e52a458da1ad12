#!/usr/bin/env python3
"""temb against a real Triton Inference Server serving the same embedding,
all driven by the same perf_analyzer over gRPC and HTTP, concurrency 1 and
8, batch 1 and 8.  Two Triton baselines, both Triton 2.51 as bundled by
nvidia-pytriton 0.7.0, computing in numpy on the Python backend:
  triton    a plain model repository (bench/triton/model_repository/), the
            way Python models are usually deployed;
  pytriton  PyTriton's own serving (pytriton_server.py): the model runs in
            the Python process that binds it, behind PyTriton's proxy.

The servers run side by side on this machine and every configuration is
measured on each in turn, so that the ratios compare runs under the same
load; the report gives medians over rounds and temb/Triton ratios of
throughput and p50 latency.

  python3 -m venv /tmp/triton-venv
  /tmp/triton-venv/bin/pip install nvidia-pytriton==0.7.0
  .venv/bin/python bench/triton/compare.py --triton-python \\
      /tmp/triton-venv/bin/python --rounds 3 --json > triton.json

perf_analyzer comes from the project venv (tritonclient 2.41 wheel); the
Triton side runs in its own venv (see pytriton_server.py for why
LD_LIBRARY_PATH is set).
"""

import argparse
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request

import numpy as np

from common import (REPO, TembServer, cpu_model, input_data_file, median,
                    run_perf_analyzer)

PROTOCOLS = ["grpc", "http"]
CONFIGS = [(1, 1), (8, 1), (1, 8), (8, 8)]  # (concurrency, batch)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ready(http_port, process, deadline, log):
    url = f"http://127.0.0.1:{http_port}/v2/models/sd15/ready"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("Triton did not get ready:\n" +
                               pathlib.Path(log).read_text(errors="replace"))
        time.sleep(0.5)


def _stop_group(process):
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


class _TritonProcess:
    """A Triton server process in its own process group, ready once its
    sd15 model is; its output goes to a log file kept for errors."""

    def _start(self, command, env, log_prefix, timeout):
        self.log = tempfile.NamedTemporaryFile(  # pylint: disable=consider-using-with
            prefix=log_prefix, suffix=".log", delete=False)
        self.process = subprocess.Popen(  # pylint: disable=consider-using-with
            command, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        try:
            _ready(self.http_port, self.process, time.monotonic() + timeout,
                   self.log.name)
        except RuntimeError:
            self.stop()
            raise

    def stop(self):
        _stop_group(self.process)


class PlainTritonServer(_TritonProcess):
    """PyTriton's bundled tritonserver on bench/triton/model_repository, with
    a backend directory assembled from PyTriton's distribution (the Python
    backend and the stub for this Python version)."""

    def __init__(self, python, timeout=180):
        site = pathlib.Path(subprocess.run(
            [python, "-c", "import pytriton, pathlib; "
             "print(pathlib.Path(pytriton.__file__).parent)"],
            capture_output=True, text=True, check=True, timeout=60)
            .stdout.strip())
        dist = site / "tritonserver"
        version = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, check=True, timeout=60
        ).stdout.strip()
        backends = pathlib.Path(tempfile.mkdtemp(prefix="triton-backends-"))
        shutil.copytree(dist / "backends", backends, dirs_exist_ok=True)
        shutil.copy(dist / "python_backend_stubs" / version /
                    "triton_python_backend_stub", backends / "python")
        self.http_port, self.grpc_port, metrics = (free_port(), free_port(),
                                                   free_port())
        env = dict(os.environ)
        # The stub embeds libpython (pyenv's, not Debian's) and finds numpy
        # through the venv's python on PATH, as PyTriton arranges it.
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [sysconfig.get_config_var("LIBDIR"),
             str(site.parent / "nvidia_pytriton.libs")] +
            [p for p in [env.get("LD_LIBRARY_PATH")] if p])
        env["PATH"] = os.pathsep.join([str(pathlib.Path(python).parent),
                                       env["PATH"]])
        self._start(
            [str(dist / "bin" / "tritonserver"),
             f"--model-repository={pathlib.Path(__file__).with_name('model_repository')}",
             f"--backend-directory={backends}", f"--http-port={self.http_port}",
             f"--grpc-port={self.grpc_port}", f"--metrics-port={metrics}",
             "--log-warning=false", "--log-info=false"],
            env, "triton-", timeout)


class TritonServer(_TritonProcess):
    def __init__(self, python, timeout=180):
        self.http_port, self.grpc_port, metrics = (free_port(), free_port(),
                                                   free_port())
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [sysconfig.get_config_var("LIBDIR")] +
            [p for p in [env.get("LD_LIBRARY_PATH")] if p])
        self._start(
            [python, str(pathlib.Path(__file__).with_name(
                "pytriton_server.py")),
             f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
             f"--metrics-port={metrics}"],
            env, "pytriton-", timeout)


def embeddings(http_port, timesteps):
    body = json.dumps({"inputs": [{
        "name": "TIMESTEP", "shape": [len(timesteps), 1], "datatype": "FP32",
        "data": timesteps}]}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/v2/models/sd15/infer", data=body,
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    return np.array(answer["outputs"][0]["data"], dtype=np.float32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--triton-python", required=True,
                        help="python of a venv with nvidia-pytriton==0.7.0")
    parser.add_argument("--temb-server",
                        default=str(REPO / "build" / "bin" / "temb-server"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval_ms", type=int, default=1500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    data = input_data_file(tempfile.mkdtemp(prefix="temb-triton-"))
    servers = {}
    results = {}
    try:
        servers["temb"] = TembServer(args.temb_server, "--backend=cpu")
        servers["triton"] = PlainTritonServer(args.triton_python)
        servers["pytriton"] = TritonServer(args.triton_python)
        steps = [999.0, 500.0, 1.0, 0.0]
        reference = embeddings(servers["temb"].http_port, steps)
        max_diff = max(
            float(np.max(np.abs(embeddings(servers[k].http_port, steps) -
                                reference))) for k in ("triton", "pytriton"))
        for round_index in range(args.rounds):
            for protocol in PROTOCOLS:
                for concurrency, batch in CONFIGS:
                    for name, server in servers.items():
                        port = (server.grpc_port if protocol == "grpc"
                                else server.http_port)
                        row = run_perf_analyzer(
                            f"127.0.0.1:{port}", "sd15", protocol=protocol,
                            batch=batch, concurrency=concurrency,
                            input_data=data, interval_ms=args.interval_ms)
                        key = (name, protocol, concurrency, batch)
                        results.setdefault(key, []).append(row)
                        print(f"round {round_index} {name:8s} {protocol:4s} "
                              f"c={concurrency} b={batch}: "
                              f"{row['Inferences/Second']:.0f} infer/s, p50 "
                              f"{row['p50 latency']:.0f} us", file=sys.stderr)
    finally:
        for server in servers.values():
            server.stop()

    # With --json, stdout carries only the JSON (for bench/run.py); the
    # table goes to stderr.
    out = sys.stderr if args.json else sys.stdout
    summary = {"cpu": cpu_model(), "rounds": args.rounds,
               "max_abs_diff": max_diff, "configs": []}
    print(f"\nCPU: {summary['cpu']}, client and servers on one machine; "
          f"medians of {args.rounds} rounds; max |temb - Triton| = "
          f"{max_diff:.2g} (numpy's float32 op order, not PyTorch's)", file=out)
    print("| protocol | concurrency | batch | temb infer/s | Triton infer/s "
          "| PyTriton infer/s | temb/Triton | temb/PyTriton | temb p50 us | "
          "Triton p50 us | PyTriton p50 us |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|---|", file=out)
    for protocol in PROTOCOLS:
        for concurrency, batch in CONFIGS:
            cell = {}
            for name in ("temb", "triton", "pytriton"):
                rows = results[(name, protocol, concurrency, batch)]
                cell[name] = {
                    "infer_per_s": median(
                        [r["Inferences/Second"] for r in rows]),
                    "p50_us": median([r["p50 latency"] for r in rows]),
                    "p99_us": median([r["p99 latency"] for r in rows])}
            ratios = {f"temb_over_{name}": cell["temb"]["infer_per_s"] /
                      cell[name]["infer_per_s"]
                      for name in ("triton", "pytriton")}
            summary["configs"].append({
                "protocol": protocol, "concurrency": concurrency,
                "batch": batch, **cell, **ratios})
            print(f"| {protocol} | {concurrency} | {batch} | "
                  f"{cell['temb']['infer_per_s']:.0f} | "
                  f"{cell['triton']['infer_per_s']:.0f} | "
                  f"{cell['pytriton']['infer_per_s']:.0f} | "
                  f"{ratios['temb_over_triton']:.1f} | "
                  f"{ratios['temb_over_pytriton']:.1f} | "
                  f"{cell['temb']['p50_us']:.0f} | "
                  f"{cell['triton']['p50_us']:.0f} | "
                  f"{cell['pytriton']['p50_us']:.0f} |", file=out)
    if args.json:
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
