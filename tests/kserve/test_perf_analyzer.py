"""Triton's perf_analyzer (the PyPI `perf-analyzer` binary) load-tests a
preset model over gRPC and must finish cleanly with its usual report."""

import csv
import subprocess

from temb_perf_analyzer import find_perf_analyzer, perf_analyzer_env


def test_perf_analyzer_sd15(server, tmp_path):
    csv_path = tmp_path / "out.csv"
    command = [
        find_perf_analyzer(), "-i", "grpc", "-u", server.target, "-m", "sd15",
        "-b", "8", "--concurrency-range", "4", "--measurement-interval",
        "1000", "-f", str(csv_path),
        # A shared 2-core CI machine is noisy: accept any window as stable
        # rather than failing on the default 10% spread.
        "--stability-percentage", "100"]
    run = subprocess.run(command, env=perf_analyzer_env(), capture_output=True,
                         text=True, timeout=180, check=False)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    assert "error" not in report.lower(), report
    assert "Concurrency: 4, throughput:" in report, report
    assert "infer/sec" in report and "usec" in report, report
    assert "p99 latency" in report, report
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and rows[0]["Concurrency"] == "4", rows
    assert float(rows[0]["Inferences/Second"]) > 0, rows
