"""SIGTERM while clients are busy: the server lets in-flight calls finish,
refuses new ones with UNAVAILABLE, and exits 0."""
import json
import subprocess
import time

import grpc
import numpy as np

from conftest import TEMB, temb

# A call the single-threaded CPU backend needs over a second for (32768 x
# 1024 elements, angles in float64), sent on a raw channel that is already
# connected, so that it is surely in flight when SIGTERM arrives.
BIG_ROWS, BIG_DIM = 32768, 1024


def test_sigterm_drains(start_server, pb):
    v1, v1_grpc = pb
    server = start_server("--backend=cpu", "--cpu_threads=1",
                          "--drain_grace=30s")
    options = [("grpc.max_receive_message_length", 512 << 20)]
    with grpc.insecure_channel(server.target, options=options) as channel:
        # Connect first, so that the big call reaches the server at once.
        grpc.channel_ready_future(channel).result(timeout=10)
        big = v1_grpc.EmbeddingServiceStub(channel).Embed.future(
            v1.EmbedRequest(
                preset="ldm", spec=v1.EmbeddingSpec(dim=BIG_DIM, precision=2),
                timesteps=[i % 1000 for i in range(BIG_ROWS)]),
            timeout=60)
        bench = subprocess.Popen(
            [str(TEMB), "bench", "--target", server.target, "--duration=4s",
             "--warmup=0s", "--concurrency=16", "--max_attempts=1",
             "--allow_errors", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            time.sleep(0.5)
            assert not big.done(), "the big call finished before SIGTERM"
            assert server.terminate(timeout=60) == 0, server.log()
            response = big.result(timeout=60)
            bench_out, bench_err = bench.communicate(timeout=60)
        finally:
            if bench.poll() is None:
                bench.kill()
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
