"""SIGTERM while clients are busy: the server lets in-flight calls finish,
refuses new ones with UNAVAILABLE, and exits 0."""
import json
import subprocess
import time

import grpc
import numpy as np

from conftest import SERVER, TEMB, TembServer, temb
from temb_testing import paused

# A call the single-threaded CPU backend needs over a second for (32768 x
# 1024 elements, angles in float64), sent on a raw channel that is already
# connected; SIGTERM follows once the server is seen computing it.
BIG_ROWS, BIG_DIM = 32768, 1024


def test_sigterm_drains(tmp_path, pb):
    v1, v1_grpc = pb
    # Metrics on: the test waits on the server's own counts, not on sleeps.
    server = TembServer(SERVER, tmp_path, "--log_level=warn", "--backend=cpu",
                        "--cpu_threads=1", "--drain_grace=30s", metrics=True)
    options = [("grpc.max_receive_message_length", 512 << 20)]
    bench = None
    try:
        with grpc.insecure_channel(server.target, options=options) as channel:
            # Connect first, so that the big call reaches the server at once.
            grpc.channel_ready_future(channel).result(timeout=10)
            stub = v1_grpc.EmbeddingServiceStub(channel)
            request = v1.EmbedRequest(
                preset="ldm", spec=v1.EmbeddingSpec(dim=BIG_DIM, precision=2),
                timesteps=[i % 1000 for i in range(BIG_ROWS)])
            bench = subprocess.Popen(
                [str(TEMB), "bench", "--target", server.target,
                 "--duration=10s", "--warmup=0s", "--concurrency=16",
                 "--max_attempts=1", "--allow_errors", "--json"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            # The bench has been answered at least once before SIGTERM.
            deadline = time.monotonic() + 30
            while server.metric("temb_requests_total", code="OK") < 1:
                assert time.monotonic() < deadline, "the bench got no answer"
                assert bench.poll() is None, bench.communicate()
                time.sleep(0.02)
            # The bench alone keeps the in-flight gauge at 1 or more, so
            # that gauge says nothing about the big call while the bench
            # sends: the bench pauses until the server is seen computing
            # the big call alone (its earlier calls answered, the gauge back
            # at 0, then up again).  A call is not seen any other way before
            # it ends (TembServer.call_in_flight).
            with paused(bench):
                big = server.call_in_flight(
                    lambda: stub.Embed.future(request, timeout=60))
                answered = server.metric("temb_requests_total", code="OK")
            # SIGTERM while the bench is busy again: answered once more
            # since it resumed (the big call, still computing, is not one).
            deadline = time.monotonic() + 30
            while (server.metric("temb_requests_total", code="OK") <=
                   answered and not big.done()):
                assert time.monotonic() < deadline, "the bench did not resume"
                time.sleep(0.005)
            assert server.terminate(timeout=60) == 0, server.log()
            response = big.result(timeout=60)
            bench_out, bench_err = bench.communicate(timeout=60)
    finally:
        if bench is not None and bench.poll() is None:
            bench.kill()
        server.kill()
    # The call in flight at SIGTERM completed, whole.
    assert list(response.embedding.shape) == [BIG_ROWS, BIG_DIM]
    array = np.frombuffer(response.embedding.data, dtype="<f4")
    assert array.size == BIG_ROWS * BIG_DIM
    np.testing.assert_array_equal(array[:BIG_DIM // 2], 1.0)  # t = 0
    # The bench saw only successes, then refusals.
    assert bench.returncode == 0, bench_err.decode()
    report = json.loads(bench_out)
    assert set(report["errors"]) <= {"UNAVAILABLE"}, report["errors"]
    assert report["errors"].get("UNAVAILABLE", 0) > 0
    assert report["requests"] > report["errors"]["UNAVAILABLE"]
    # And nothing listens any more.
    after = temb("health", "--target", server.target)
    assert after.returncode == 1 and b"UNAVAILABLE" in after.stderr
