"""perf_analyzer against a conditioning model, over KServe v2 gRPC and REST,
straight at temb-server and through the nginx front of deploy/front (the
shipped config, only its ports and temporary paths moved).

The model is the tiny FLUX.1-dev-like transformer of
tests/pylib/tiny_conditioning.py (D = 256, 2 + 2 blocks, fp32), saved by
diffusers into a temporary model repository; perf_analyzer's input data
(timesteps, guidance, pooled_projections) is written beside it.  The row
cache is off (--conditioning_cache_bytes=0) so every call computes, as
with a schedule never seen before.  Each configuration alternates the two
subjects round by round; the table gives medians.

    .venv/bin/python bench/triton/conditioning_perf.py --bin build/bin --rounds 3
"""
import argparse
import json
import pathlib
import sys
import tempfile

from common import REPO, TembServer, cpu_model, median, run_perf_analyzer

sys.path.insert(0, str(REPO / "tests" / "pylib"))
from temb_front import Front, moved_config  # noqa: E402
import tiny_conditioning  # noqa: E402

FRONT_CONF = REPO / "deploy" / "front" / "nginx.conf"
# (protocol, rows per request, concurrency)
CONFIGS = [("grpc", 1, 1), ("grpc", 8, 4), ("http", 1, 1), ("http", 8, 4)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default="build/bin")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval_ms", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="temb-cond-perf-"))
    repository = workdir / "models"
    tiny_conditioning.save_model(repository)
    input_data = workdir / "input.json"
    input_data.write_text(json.dumps(tiny_conditioning.input_data(64)))
    server = TembServer(pathlib.Path(args.bin) / "temb-server", "--backend=cpu",
                        f"--model_repository={repository}",
                        "--conditioning_cache_bytes=0")
    front = None
    try:
        text, listens = moved_config(FRONT_CONF.read_text(), workdir, {
            "grpc": server.grpc_port, "rest": server.http_port})
        front = Front(text, workdir, listens[50051])
        targets = {
            "direct": {"grpc": f"127.0.0.1:{server.grpc_port}",
                       "http": f"127.0.0.1:{server.http_port}"},
            "front": {"grpc": f"127.0.0.1:{listens[50051]}",
                      "http": f"127.0.0.1:{listens[8000]}"}}
        results = {(s, c): [] for s in targets for c in CONFIGS}
        for round_index in range(args.rounds):
            for config in CONFIGS:
                protocol, rows, concurrency = config
                for subject, urls in targets.items():
                    row = run_perf_analyzer(
                        urls[protocol], tiny_conditioning.NAME,
                        protocol=protocol, batch=rows, concurrency=concurrency,
                        input_data=str(input_data),
                        interval_ms=args.interval_ms)
                    results[(subject, config)].append(row)
                    print(f"round {round_index} {subject:6s} {protocol} "
                          f"rows={rows} c={concurrency}: "
                          f"{row['Inferences/Second']:.0f} rows/s, p50 "
                          f"{row['p50 latency']:.0f} us", file=sys.stderr)
    finally:
        if front is not None:
            front.stop()
        server.stop()

    out = sys.stderr if args.json else sys.stdout
    summary = {"cpu": cpu_model(), "rounds": args.rounds, "configs": []}
    print(f"\nCPU: {summary['cpu']}; medians of {args.rounds} rounds "
          f"(perf_analyzer, model {tiny_conditioning.NAME}, cache off)",
          file=out)
    print("| protocol | rows/request | concurrency | direct rows/s | "
          "front rows/s | direct p50 us | front p50 us | direct p99 us | "
          "front p99 us |", file=out)
    print("|---|---|---|---|---|---|---|---|---|", file=out)
    for config in CONFIGS:
        cells = {}
        for subject in ("direct", "front"):
            rows = results[(subject, config)]
            cells[subject] = {
                "rows_per_s": median([r["Inferences/Second"] for r in rows]),
                "p50_us": median([r["p50 latency"] for r in rows]),
                "p99_us": median([r["p99 latency"] for r in rows])}
        protocol, batch, concurrency = config
        print(f"| {protocol} | {batch} | {concurrency} | "
              f"{cells['direct']['rows_per_s']:.0f} | "
              f"{cells['front']['rows_per_s']:.0f} | "
              f"{cells['direct']['p50_us']:.0f} | {cells['front']['p50_us']:.0f} | "
              f"{cells['direct']['p99_us']:.0f} | {cells['front']['p99_us']:.0f} |",
              file=out)
        summary["configs"].append({"protocol": protocol, "rows": batch,
                                   "concurrency": concurrency, **cells})
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
