#!/usr/bin/env python3
"""Per-call latency of gRPC over a unix domain socket against loopback TCP:
two temb-servers with the same flags, one on unix:PATH and one on
127.0.0.1:PORT, measured with `temb bench` (closed loop, unary) in
alternating rounds; medians over rounds and the unix/TCP ratios.

  bench/triton/unix_vs_tcp.py --bin build/bin --rounds 5
"""

import argparse
import json
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

from common import cpu_model, median

CONFIGS = [(1, 1), (8, 1), (1, 64)]  # (concurrency, batch)


def start(binary, address, workdir):
    port_file = workdir / f"port-{time.monotonic_ns()}"
    process = subprocess.Popen(  # pylint: disable=consider-using-with
        [str(binary), f"--address={address}", f"--port_file={port_file}",
         "--metrics_address=", "--backend=cpu", "--log_level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text().strip()):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"temb-server on {address} did not start")
        time.sleep(0.05)
    return process, int(port_file.read_text())


def bench(temb, target, concurrency, batch, duration):
    run = subprocess.run(
        [str(temb), "bench", f"--target={target}",
         f"--concurrency={concurrency}", f"--batch={batch}",
         f"--duration={duration}s", "--warmup=1s", "--preset=sd15",
         "--json"], capture_output=True, text=True, timeout=duration + 60,
        check=True)
    return json.loads(run.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", default="build/bin")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    binaries = pathlib.Path(args.bin)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="temb-unix-"))
    socket_path = workdir / "temb.sock"
    unix, _ = start(binaries / "temb-server", f"unix:{socket_path}", workdir)
    tcp, port = start(binaries / "temb-server", "127.0.0.1:0", workdir)
    targets = {"unix": f"unix:{socket_path}", "tcp": f"127.0.0.1:{port}"}
    results = {(k, c): [] for k in targets for c in CONFIGS}
    try:
        for round_index in range(args.rounds):
            for config in CONFIGS:
                for kind, target in targets.items():
                    report = bench(binaries / "temb", target, *config,
                                   args.duration)
                    results[(kind, config)].append(report)
                    print(f"round {round_index} {kind:4s} c={config[0]} "
                          f"b={config[1]}: p50 "
                          f"{report['latency_us']['p50']:.0f} us, "
                          f"{report['throughput_rps']:.0f} rps",
                          file=sys.stderr)
    finally:
        for process in (unix, tcp):
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)

    # With --json, stdout carries only the JSON (for bench/run.py); the
    # table goes to stderr.
    out = sys.stderr if args.json else sys.stdout
    summary = {"cpu": cpu_model(), "rounds": args.rounds, "configs": []}
    print(f"\nCPU: {summary['cpu']}; medians of {args.rounds} rounds of "
          f"{args.duration} s (temb bench, unary, sd15)", file=out)
    print("| concurrency | batch | TCP p50 us | unix p50 us | unix/TCP p50 "
          "| TCP rps | unix rps | unix/TCP rps |", file=out)
    print("|---|---|---|---|---|---|---|---|", file=out)
    for config in CONFIGS:
        cell = {}
        for kind in targets:
            rows = results[(kind, config)]
            cell[kind] = {
                "p50_us": median([r["latency_us"]["p50"] for r in rows]),
                "p99_us": median([r["latency_us"]["p99"] for r in rows]),
                "rps": median([r["throughput_rps"] for r in rows])}
        summary["configs"].append({"concurrency": config[0],
                                   "batch": config[1], **cell})
        print(f"| {config[0]} | {config[1]} | {cell['tcp']['p50_us']:.0f} | "
              f"{cell['unix']['p50_us']:.0f} | "
              f"{cell['unix']['p50_us'] / cell['tcp']['p50_us']:.2f} | "
              f"{cell['tcp']['rps']:.0f} | {cell['unix']['rps']:.0f} | "
              f"{cell['unix']['rps'] / cell['tcp']['rps']:.2f} |", file=out)
    if args.json:
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
