"""Soak: two minutes of `temb bench` at concurrency 64 against one server,
with zero failed calls and flat memory.

Memory is the server's VmRSS, sampled once a second.  After a warm-up (the
allocator, gRPC's thread pools and the CPU backend's buffers reach their
working size in the first seconds), the highest sample of the last third of
the run must stay within 15% (plus 4 MiB for page-granular noise) of the
highest sample of the first third.  A leak of as little as 64 bytes per call
fails this: at the few thousand calls per second this machine serves, that
is over 15 MiB across the 40 s between the thirds, more than the bound on a
server whose working set is a few tens of MiB.

Under AddressSanitizer (the sanitizer stage) RSS only shows the allocator's
quarantine filling up; there the server instead exits cleanly after the
run, so that the leak checker reports what the calls leaked.
"""
import json
import os
import subprocess
import threading
import time

from conftest import TEMB

# TEMB_SOAK_SECONDS shortens the run where the point is another check (the
# sanitizer stage runs the soak for leaks and races, not for its length).
SOAK_SECONDS = int(os.environ.get("TEMB_SOAK_SECONDS", "120"))
WARMUP_SECONDS = 10
CONCURRENCY = 64
GROWTH = 1.15
SLACK_BYTES = 4 << 20


def test_soak_zero_errors_and_flat_memory(start_server):
    server = start_server("--backend=cpu")
    samples = []  # (seconds since start, rss)
    done = threading.Event()

    def sample():
        start = time.monotonic()
        while not done.wait(1.0):
            samples.append((time.monotonic() - start, server.rss_bytes()))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        bench = subprocess.run(
            [str(TEMB), "bench", "--target", server.target,
             f"--duration={SOAK_SECONDS}s", f"--warmup={WARMUP_SECONDS}s",
             f"--concurrency={CONCURRENCY}", "--batch=16", "--json"],
            capture_output=True, text=True,
            timeout=SOAK_SECONDS + WARMUP_SECONDS + 120)
    finally:
        done.set()
        sampler.join()
    server_view = {labels: value for (name, labels), value
                   in server.metrics().items()
                   if name in ("temb_requests_total",
                               "temb_rejected_requests_total") and value}
    assert bench.returncode == 0, (bench.stderr, bench.stdout, server_view)
    report = json.loads(bench.stdout)
    assert report["requests"] > 0 and report["ok"] == report["requests"], report
    assert not report["errors"], report
    assert server.alive(), server.log()
    assert server.metric("temb_inflight_requests") == 0

    if "ASAN_OPTIONS" in os.environ:
        # Under AddressSanitizer (scripts/sanitize.sh) RSS climbs until the
        # allocator's quarantine is full, whatever the server does, so the
        # flat-memory bound says nothing there.  Its leak checker does: it
        # runs when the server exits, and a report fails the exit status.
        assert server.terminate(timeout=60) == 0, server.log()
        return
    measured = [rss for t, rss in samples if t >= WARMUP_SECONDS]
    # One sample a second; half of them is plenty to compare thirds.
    assert len(measured) >= SOAK_SECONDS // 2, (
        f"too few RSS samples: {len(measured)}")
    third = len(measured) // 3
    first, last = max(measured[:third]), max(measured[-third:])
    print(f"calls {report['requests']}, {report['throughput_rps']:.0f}/s; "
          f"RSS first third max {first >> 20} MiB, "
          f"last third max {last >> 20} MiB")
    assert last <= first * GROWTH + SLACK_BYTES, (
        f"RSS grew from {first} to {last} bytes over the soak "
        f"(samples: {measured})")
