"""perf_analyzer over HTTP, its default protocol (no -i flag), against the
REST port: it must finish with its usual report, including the server-side
breakdown it reads from the statistics extension.  The same for gRPC."""
import csv
import json
import subprocess

from temb_perf_analyzer import find_perf_analyzer, perf_analyzer_env


def run(tmp_path, *args):
    data = tmp_path / "timesteps.json"
    # perf_analyzer's own default FP32 input is the constant 1.85e31.
    data.write_text(json.dumps(
        {"data": [{"TIMESTEP": [t]} for t in (999.0, 500.0, 1.0)]}))
    csv_path = tmp_path / "out.csv"
    command = [find_perf_analyzer(), *args, "-m", "sd15", "-b", "8",
               "--concurrency-range", "2", "--input-data", str(data),
               "--measurement-interval", "1000", "-f", str(csv_path),
               # A shared 2-core machine is noisy: any window is stable.
               "--stability-percentage", "100"]
    result = subprocess.run(command, env=perf_analyzer_env(),
                            capture_output=True, text=True, timeout=180,
                            check=False)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    assert "error" not in report.lower(), report
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return report, rows


def check(report, rows):
    assert "Concurrency: 2, throughput:" in report, report
    assert "p99 latency" in report, report
    # The statistics extension: perf_analyzer's "Server:" section.
    assert "Server:" in report, report
    assert "Inference count:" in report and "compute infer" in report, report
    assert len(rows) == 1 and rows[0]["Concurrency"] == "2", rows
    assert float(rows[0]["Inferences/Second"]) > 0, rows
    assert float(rows[0]["Server Compute Infer"]) > 0, rows


def test_perf_analyzer_http_default_protocol(server, tmp_path):
    report, rows = run(tmp_path, "-u", server.http)
    assert "Avg HTTP time" in report, report
    check(report, rows)


def test_perf_analyzer_grpc_reads_statistics_too(server, tmp_path):
    report, rows = run(tmp_path, "-i", "grpc", "-u", server.target)
    assert "Avg gRPC time" in report, report
    check(report, rows)
