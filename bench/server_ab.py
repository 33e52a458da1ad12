"""Two temb-server builds side by side, same run: A (the baseline) and B
(the candidate), each on the CPU backend, driven by the same `temb bench`
client in alternating order, round after round.  Prints a Markdown table of
medians with the ratio B/A, so that a change to the request path can show
that it costs nothing measurable.

    python3 bench/server_ab.py --a OLD/temb-server --b NEW/temb-server \
        --client NEW/temb [--rounds 7] [--seconds 3]

The cases: unary 1x320 (sdxl preset) p50 latency at concurrency 1 and
throughput at concurrency 8, and the same for flux's two-part request
(timestep and guidance, one row each).
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import Server  # noqa: E402  (the benchmark suite's server runner)

CASES = [
    # (name, bench flags, concurrency, figure)
    ("unary 1x320 sdxl, p50 us, concurrency 1", ["--preset=sdxl",
                                                 "--batch=1"], 1, "p50"),
    ("unary 1x320 sdxl, calls/s, concurrency 8", ["--preset=sdxl",
                                                  "--batch=1"], 8, "rps"),
    ("flux parts (timestep, guidance), p50 us, concurrency 1",
     ["--preset=flux", "--part=timestep:0.5", "--part=guidance:3.5"], 1,
     "p50"),
    ("flux parts (timestep, guidance), calls/s, concurrency 8",
     ["--preset=flux", "--part=timestep:0.5", "--part=guidance:3.5"], 8,
     "rps"),
]


def measure(client, target, flags, concurrency, seconds):
    out = subprocess.run(
        [client, "bench", f"--target={target}", *flags,
         f"--concurrency={concurrency}", f"--duration={seconds}s",
         "--warmup=1s", "--json"],
        check=True, stdout=subprocess.PIPE, text=True,
        timeout=seconds * 4 + 60).stdout
    report = json.loads(out)
    return {"p50": report["latency_us"]["p50"],
            "rps": report["throughput_rps"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="baseline temb-server")
    parser.add_argument("--b", required=True, help="candidate temb-server")
    parser.add_argument("--client", required=True, help="temb CLI")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    samples = {(case[0], side): [] for case in CASES for side in "ab"}
    with tempfile.TemporaryDirectory() as workdir:
        servers = {}
        try:
            for side, binary in (("a", args.a), ("b", args.b)):
                servers[side] = Server(side, [
                    binary, "--address=127.0.0.1:0", "--metrics_address=",
                    "--log_level=warn", "--backend=cpu"], workdir)
            for r in range(args.rounds):
                order = "ab" if r % 2 == 0 else "ba"
                for name, flags, concurrency, figure in CASES:
                    for side in order:
                        result = measure(args.client, servers[side].target,
                                         flags, concurrency, args.seconds)
                        samples[name, side].append(result[figure])
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            for server in servers.values():
                server.stop()
    print(f"{args.rounds} rounds, {args.seconds:g} s each, order alternating"
          " A,B / B,A; medians\n")
    print("| case | A (baseline) | B (candidate) | B / A | spread of B/A "
          "over rounds |")
    print("|---|---:|---:|---:|---|")
    for name, _, _, _ in CASES:
        a = samples[name, "a"]
        b = samples[name, "b"]
        ratios = sorted(y / x for x, y in zip(a, b))
        print(f"| {name} | {statistics.median(a):.1f} | "
              f"{statistics.median(b):.1f} | "
              f"{statistics.median(b) / statistics.median(a):.3f} | "
              f"{ratios[0]:.3f} to {ratios[-1]:.3f} |")


if __name__ == "__main__":
    main()
