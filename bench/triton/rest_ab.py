#!/usr/bin/env python3
"""A/B of two temb-server binaries over REST (e.g. the same tree built on
two HTTP libraries, or before/after a change), driven by perf_analyzer over
HTTP (its default protocol) with small inference requests.

Rounds alternate the two servers, so that both see the same machine state;
the report gives medians over rounds and the B/A ratio of requests/s.

  bench/triton/http_library_ab.py --a civetweb=/tmp/a/temb-server \
      --b httplib=build/bin/temb-server --rounds 3
"""

import argparse
import json
import sys
import tempfile

from common import (TembServer, cpu_model, input_data_file, median,
                    run_perf_analyzer)

CONFIGS = [(1, 1), (8, 1), (1, 8), (8, 8)]  # (concurrency, batch)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", required=True, help="LABEL=PATH")
    parser.add_argument("--b", required=True, help="LABEL=PATH")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="sd15")
    parser.add_argument("--interval_ms", type=int, default=1500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    binaries = dict(x.split("=", 1) for x in (args.a, args.b))
    a, b = list(binaries)
    tmp = tempfile.mkdtemp(prefix="temb-http-ab-")
    data = input_data_file(tmp)
    results = {lib: {c: [] for c in CONFIGS} for lib in (a, b)}
    for round_index in range(args.rounds):
        for lib in (a, b):
            server = TembServer(binaries[lib], "--backend=cpu")
            try:
                for concurrency, batch in CONFIGS:
                    row = run_perf_analyzer(
                        f"127.0.0.1:{server.http_port}", args.model,
                        batch=batch, concurrency=concurrency,
                        input_data=data, interval_ms=args.interval_ms)
                    results[lib][(concurrency, batch)].append(row)
                    print(f"round {round_index} {lib:8s} c={concurrency} "
                          f"b={batch}: {row['Inferences/Second']:.0f} infer/s "
                          f"p50 {row['p50 latency']:.0f} us",
                          file=sys.stderr)
            finally:
                server.stop()

    # With --json, stdout carries only the JSON (for bench/run.py); the
    # table goes to stderr.
    out = sys.stderr if args.json else sys.stdout
    summary = {"cpu": cpu_model(), "rounds": args.rounds, "configs": []}
    print(f"\nCPU: {summary['cpu']}; medians of {args.rounds} rounds", file=out)
    print(f"| concurrency | batch | {a} req/s | {b} req/s | "
          f"{b}/{a} | {a} p50 us | {b} p50 us |", file=out)
    print("|---|---|---|---|---|---|---|", file=out)
    for concurrency, batch in CONFIGS:
        cell = {}
        for lib in (a, b):
            rows = results[lib][(concurrency, batch)]
            cell[lib] = {
                "requests_per_s": median(
                    [r["Inferences/Second"] / batch for r in rows]),
                "p50_us": median([r["p50 latency"] for r in rows]),
                "p99_us": median([r["p99 latency"] for r in rows]),
            }
        ratio = cell[b]["requests_per_s"] / cell[a]["requests_per_s"]
        summary["configs"].append({"concurrency": concurrency,
                                   "batch": batch, **cell,
                                   "b_over_a": ratio})
        print(f"| {concurrency} | {batch} | "
              f"{cell[a]['requests_per_s']:.0f} | "
              f"{cell[b]['requests_per_s']:.0f} | {ratio:.2f} | "
              f"{cell[a]['p50_us']:.0f} | {cell[b]['p50_us']:.0f} |", file=out)
    if args.json:
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
