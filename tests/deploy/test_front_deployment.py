"""The base Deployment's pod on loopback: temb-server with the rendered
Deployment's own flags, serving a model repository that holds a tiny
conditioning model made by diffusers, behind nginx running the config that
the rendered ConfigMap holds (only its ports and temporary paths moved, as
tests/reliability/test_front.py does with the file).

Through the front's ports, gRPC, REST and /metrics answer as temb-server does
directly; one endless HTTP/2 header block (CONTINUATION frames,
CVE-2023-33953) at the front's gRPC port is cut off by nginx with
temb-server's memory flat, and a conditioning call still answers the same
bytes.  The same flood straight at temb-server grows it, so the measurement
can see what the front prevents.
"""

import re
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import tembproc
import test_manifests as manifests

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "reliability"))
sys.path.insert(0, str(REPO / "tests" / "pylib"))
from h2_flood import continuation_flood  # noqa: E402
from temb_front import Front, moved_config  # noqa: E402
from temb_testing import TembServer  # noqa: E402
import tiny_conditioning  # noqa: E402

MiB = 1 << 20
FLOOD_PATH = "/inference.GRPCInferenceService/ModelInfer"


class Peak:
    """Samples `rss()` every 10 ms in a thread; `.growth` once stopped."""

    def __init__(self, rss):
        self.rss = rss
        self.before = rss()
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.01)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss())

    @property
    def growth(self):
        return self.peak - self.before


@pytest.fixture(scope="module")
def pod(tmp_path_factory):
    """(server, front, {"grpc"|"http"|"metrics": front port})."""
    docs = manifests.render(manifests.DEPLOY / "base")
    (_, spec, container), = manifests.server_containers(docs)
    config = manifests.front_config(docs, spec)
    workdir = tmp_path_factory.mktemp("pod")
    repository = workdir / "models"
    tiny_conditioning.save_model(repository)
    # The Deployment's flags; the addresses become OS-picked loopback ports
    # and the repository the test's (the Deployment's is a volume).
    flags = [a for a in container["args"] if not a.startswith((
        "--address=", "--http_address=", "--metrics_address=",
        "--model_repository="))]
    server = TembServer(
        tembproc.binary("temb-server"), workdir, "--backend=cpu",
        "--http_address=127.0.0.1:0", f"--http_port_file={workdir / 'http_port'}",
        f"--model_repository={repository}", *flags, metrics=True)
    front = None
    try:
        http_port = server._read_port(workdir / "http_port",  # pylint: disable=protected-access
                                      time.monotonic() + 30)
        text, listens = moved_config(config, workdir, {
            "grpc": server.port, "rest": http_port,
            "metrics": server.metrics_port})
        ports = {"grpc": listens[50051], "http": listens[8000],
                 "metrics": listens[9090]}
        front = Front(text, workdir, ports["grpc"])
        # Readiness as the Deployment asks it, through the front.
        deadline = time.monotonic() + 60
        while not tembproc.health(f"127.0.0.1:{ports['grpc']}",
                                  manifests.MODELS_HEALTH):
            assert server.alive(), server.log()
            assert time.monotonic() < deadline, "temb.models never SERVING"
            time.sleep(0.2)
        yield server, front, ports
    finally:
        if front is not None:
            front.stop()
        server.stop()


def answers_equal(a, b):
    return a.keys() == b.keys() and all(
        a[k].tobytes() == b[k].tobytes() and a[k].shape == b[k].shape
        for k in a)


def test_every_front_port_answers_as_the_server(pod):
    server, _, ports = pod
    direct = tiny_conditioning.infer_grpc(server.target)
    assert {"temb", "img_mod", "txt_mod", "single_mod", "norm_out"} <= direct.keys()
    assert answers_equal(
        tiny_conditioning.infer_grpc(f"127.0.0.1:{ports['grpc']}"), direct)
    assert answers_equal(
        tiny_conditioning.infer_http(f"127.0.0.1:{ports['http']}"), direct)
    url = f"http://127.0.0.1:{ports['metrics']}"
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    assert re.search(r'^temb_conditioning_model_weight_bytes\{model="flux-tiny"\} [1-9]',
                     text, re.M), text[:2000]
    # Only GET /metrics: the metrics port is no way into anything else.
    for request in (urllib.request.Request(url + "/v2/health/ready"),
                    urllib.request.Request(url + "/metrics", data=b"x")):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)  # pylint: disable=consider-using-with
        assert refused.value.code in (403, 404)


def test_endless_header_block_is_cut_off_with_the_server_flat(pod):
    server, front, ports = pod
    front_grpc = f"127.0.0.1:{ports['grpc']}"
    before = tiny_conditioning.infer_grpc(front_grpc)
    front_before = front.rss_bytes()
    with Peak(server.rss_bytes) as peak:
        sent = continuation_flood("127.0.0.1", ports["grpc"], 64 * MiB,
                                  mode="repeat", path=FLOOD_PATH, timeout=60)
    # nginx closed the connection long before 64 MiB (its header limit is
    # 32 KiB; what was sent is what the kernel's buffers took meanwhile).
    print(f"front: {sent / MiB:.2f} MiB of header block taken before the "
          f"close; temb-server grew {peak.growth / MiB:.1f} MiB")
    assert sent < 32 * MiB, sent >> 20
    assert peak.growth < 16 * MiB, f"temb-server grew {peak.growth >> 20} MiB"
    assert front.rss_bytes() - front_before < 64 * MiB
    assert server.alive(), server.log()
    # Conditioning calls through the front still answer the same bytes.
    assert answers_equal(tiny_conditioning.infer_grpc(front_grpc), before)
    assert answers_equal(
        tiny_conditioning.infer_http(f"127.0.0.1:{ports['http']}"), before)
    # The same flood without the front: the Deployment's flags (a 64 MiB
    # gRPC quota) do not keep temb-server flat, the front does.
    with Peak(server.rss_bytes) as direct:
        continuation_flood("127.0.0.1", server.port, 64 * MiB, mode="repeat",
                           path=FLOOD_PATH, timeout=60)
    print(f"direct: temb-server grew {direct.growth / MiB:.0f} MiB")
    assert direct.growth > 64 * MiB, (
        f"the flood straight at temb-server grew it by only "
        f"{direct.growth >> 20} MiB: has gRPC's HPACK parser been fixed "
        "(CVE-2023-33953)?")
