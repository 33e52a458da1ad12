#!/usr/bin/env python3
"""The Python client's per-call latency against the C++ client's, on one
temb-server, batch 1 (sdxl preset, fp32), one call in flight.

In each round, one after the other:
  - C++: `temb bench --concurrency=1 --batch=1` (the C++ client library),
    its p50;
  - Python, temb.Client(transport="grpcio"): embed() p50 over the round;
  - Python, temb.Client(transport="native"): the same through gRPC's C++
    library (client/transport);
  - Python, temb.torch.Timesteps with that native client: the module call
    on a torch tensor, p50;
  - Python, temb.aio.Client: awaited calls one after the other in an event
    loop, p50, through grpc.aio and through the native transport (the call
    started in C++, its result handed to the loop by gRPC's thread);
  - over a unix domain socket (a second temb-server on
    --address=unix:PATH): the C++ client, the native Python client and the
    module again.
The ratios are Python p50 / C++ p50 of the same round and socket kind; the
report gives the medians over rounds.  Goal: native within 1.3x.

Usage: bench/python_client_bench.py [--rounds 5] [--seconds 3] [--installed]
    (from a checkout after building; TEMB_BIN_DIR=<build>/bin when the build
     directory is not ./build)
    --installed: measure the temb package installed in the running
    interpreter (e.g. a virtualenv's python after `pip install
    ./client/python`) instead of client/python and <build>/python; the
    temb.torch rows are left out where torch is not installed.
Prints one JSON object, with the machine, commit and date it ran on.
"""
import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(os.environ.get("TEMB_BIN_DIR", REPO / "build" / "bin"))
# Decided before `import temb`: which temb package is measured.
INSTALLED = "--installed" in sys.argv[1:]
if not INSTALLED:
    sys.path.insert(0, str(REPO / "client" / "python"))
    os.environ.setdefault("TEMB_LOCAL_EXTENSION_DIR",
                          str(BIN.parent / "python"))
sys.path.insert(0, str(REPO / "tests" / "pylib"))

import numpy as np  # noqa: E402

import temb  # noqa: E402
import temb.aio  # noqa: E402
from temb_testing import TembServer  # noqa: E402


def python_p50_us(call, seconds):
    for _ in range(200):
        call()
    latencies = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - start)
    return statistics.median(latencies) * 1e6


def aio_p50_us(target, transport, t, seconds):
    async def measure():
        async with temb.aio.Client(target, transport=transport) as client:
            assert client.transport == transport
            for _ in range(200):
                await client.embed(t, preset="sdxl")
            latencies = []
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                await client.embed(t, preset="sdxl")
                latencies.append(time.perf_counter() - start)
            return statistics.median(latencies) * 1e6
    return asyncio.run(measure())


class UnixServer:
    """temb-server on a unix domain socket, serving once it answers."""

    def __init__(self, directory):
        self.target = f"unix:{directory}/temb.sock"
        self.log = open(Path(directory) / "unix-server.log", "w")
        self.process = subprocess.Popen(
            [str(BIN / "temb-server"), f"--address={self.target}",
             "--metrics_address=", "--backend=cpu"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        with temb.Client(self.target, timeout=1, transport="grpcio") as c:
            while True:
                try:
                    c.health()
                    break
                except temb.TembError:
                    if (time.monotonic() > deadline
                            or self.process.poll() is not None):
                        raise RuntimeError("the unix-socket server did not "
                                           "start") from None
                    time.sleep(0.1)

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=15)
        self.log.close()


def cpp_p50_us(target, seconds):
    out = subprocess.run(
        [str(BIN / "temb"), "bench", f"--target={target}", "--preset=sdxl",
         "--batch=1", "--concurrency=1", f"--duration={seconds}s",
         "--warmup=1s", "--json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)["latency_us"]["p50"]


def environment():
    """Where and what was measured."""
    cpu = next((line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short",
                             "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    from temb import _transport  # pylint: disable=import-outside-toplevel
    return {"cpu": cpu, "cores": os.cpu_count(), "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "python": sys.executable, "temb": temb.__file__,
            "transport_extension": _transport._extension().__file__}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--installed", action="store_true",
                        help="measure the installed temb package")
    args = parser.parse_args()
    try:
        import torch  # pylint: disable=import-outside-toplevel
        import temb.torch as temb_torch  # pylint: disable=import-outside-toplevel
    except ImportError:
        if not args.installed:
            raise
        torch = None
    with tempfile.TemporaryDirectory() as tmp:
        server = TembServer(BIN / "temb-server", Path(tmp), "--backend=cpu")
        unix = UnixServer(tmp)
        try:
            t = np.array([500.0], np.float32)
            tt = None if torch is None else torch.tensor([500.0])
            rounds = []
            for _ in range(args.rounds):
                row = {"cpp": cpp_p50_us(server.target, args.seconds)}
                for transport in ("grpcio", "native"):
                    with temb.Client(server.target,
                                     transport=transport) as client:
                        assert client.transport == transport
                        row[transport] = python_p50_us(
                            lambda c=client: c.embed(t, preset="sdxl"),
                            args.seconds)
                        if transport == "native" and torch is not None:
                            module = temb_torch.Timesteps(
                                320, True, 0.0, client=client)
                            row["timesteps_module"] = python_p50_us(
                                lambda m=module: m(tt), args.seconds)
                for transport in ("grpcio", "native"):
                    row[f"aio_{transport}"] = aio_p50_us(
                        server.target, transport, t, args.seconds)
                row["unix_cpp"] = cpp_p50_us(unix.target, args.seconds)
                with temb.Client(unix.target, transport="native") as client:
                    row["unix_native"] = python_p50_us(
                        lambda c=client: c.embed(t, preset="sdxl"),
                        args.seconds)
                    if torch is not None:
                        module = temb_torch.Timesteps(320, True, 0.0,
                                                      client=client)
                        row["unix_timesteps_module"] = python_p50_us(
                            lambda m=module: m(tt), args.seconds)
                rounds.append(row)
        finally:
            server.stop(timeout=15)
            unix.stop()
    result = {"environment": environment(), "rounds": rounds,
              "medians_us": {}, "ratio_to_cpp": {}, "ratio_per_round": {}}
    for key in rounds[0]:
        result["medians_us"][key] = statistics.median(r[key] for r in rounds)
        if key not in ("cpp", "unix_cpp"):
            base = "unix_cpp" if key.startswith("unix_") else "cpp"
            ratios = [r[key] / r[base] for r in rounds]
            result["ratio_to_cpp"][key] = statistics.median(ratios)
            result["ratio_per_round"][key] = [round(x, 3) for x in ratios]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
