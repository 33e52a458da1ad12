"""`temb bench` against the real server: zero errors, the JSON report."""
import json
import socket

import pytest

from conftest import temb

LATENCY_KEYS = {"min", "mean", "p50", "p90", "p95", "p99", "p999", "max"}


def check_report(report, requests):
    assert {"requests", "errors", "throughput_rps", "embeddings_per_s",
            "latency_us"} <= report.keys()
    assert set(report["latency_us"]) == LATENCY_KEYS
    assert report["requests"] == requests
    assert report["errors"] == {}
    assert report["throughput_rps"] > 0 and report["embeddings_per_s"] > 0
    lat = report["latency_us"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p95"] \
        <= lat["p99"] <= lat["p999"] <= lat["max"]
    assert lat["min"] <= lat["mean"] <= lat["max"]


@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_closed_loop(server, mode):
    result = temb("bench", "--target", server.target, f"--mode={mode}",
                  "--requests=3000", "--concurrency=32", "--warmup=0s",
                  "--preset=sdxl", "--batch=4", "--json", timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(result.stdout)
    check_report(report, 3000)
    assert report["mode"] == mode
    # Four embeddings per call.
    assert report["embeddings_per_s"] == pytest.approx(
        4 * report["throughput_rps"], rel=1e-3)


@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_open_loop(server, mode):
    result = temb("bench", "--target", server.target, f"--mode={mode}",
                  "--rate=400", "--requests=400", "--warmup=0.2s",
                  "--arrivals=uniform", "--concurrency=4", "--dtype=bf16",
                  "--json", timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    check_report(json.loads(result.stdout), 400)


def test_human_report(server):
    result = temb("bench", "--target", server.target, "--duration=0.5s",
                  "--warmup=0.1s", "--concurrency=2", "--channels=2")
    text = result.stdout.decode()
    assert result.returncode == 0, result.stderr.decode()
    for needle in ("requests", "throughput", "p50", "p999"):
        assert needle in text
    assert "\r" not in result.stderr.decode()  # no progress line off a tty


def test_errors_set_the_exit_code():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["bench", "--target", f"127.0.0.1:{port}", "--requests=20",
            "--concurrency=2", "--warmup=0s", "--max_attempts=1", "--json"]
    failed = temb(*args)
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["errors"] == {"UNAVAILABLE": 20}
    allowed = temb(*args, "--allow_errors")
    assert allowed.returncode == 0


def test_server_errors_are_counted_by_code(server):
    result = temb("bench", "--target", server.target, "--preset=no-such",
                  "--requests=50", "--concurrency=4", "--warmup=0s", "--json",
                  "--allow_errors", "--mode=stream")
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(result.stdout)
    assert report["requests"] == 50 and report["errors"] == {"NOT_FOUND": 50}
