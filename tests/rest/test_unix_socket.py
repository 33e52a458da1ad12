"""gRPC on a unix domain socket: temb-server --address=unix:PATH serves it,
and every client takes the unix: target unchanged (tritonclient.grpc, the
temb CLI, the Python client on both transports), with the same numbers as the REST port of the
same server.  A stale socket file from a killed server does not block a
restart; a clean exit removes it."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import RestServer
from temb_testing import BIN_DIR, generate_client_stubs

REPO = Path(__file__).resolve().parents[2]
CLIENT_DIR = REPO / "client" / "python"


def start(tmp_path, socket_path):
    # Flags after TembServer's own --address override it.
    return RestServer(tmp_path, f"--address=unix:{socket_path}")


def wait_gone(path, timeout=30):
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not path.exists()


def test_unix_socket_serves_every_client(tmp_path):
    socket_path = tmp_path / "temb.sock"
    (tmp_path / "a").mkdir()
    srv = start(tmp_path / "a", socket_path)
    try:
        assert socket_path.is_socket()
        target = f"unix:{socket_path}"
        steps = np.array([[999.0], [250.0], [0.0]], dtype=np.float32)

        client = grpcclient.InferenceServerClient(target)
        assert client.is_server_ready()
        inp = grpcclient.InferInput("TIMESTEP", [3, 1], "FP32")
        inp.set_data_from_numpy(steps)
        over_unix = client.infer("sdxl", [inp]).as_numpy("EMBEDDING")
        client.close()

        http = httpclient.InferenceServerClient(srv.http)
        hinp = httpclient.InferInput("TIMESTEP", [3, 1], "FP32")
        hinp.set_data_from_numpy(steps)
        over_http = http.infer("sdxl", [hinp]).as_numpy("EMBEDDING")
        http.close()
        assert np.array_equal(over_unix, over_http)

        cli = BIN_DIR / "temb"
        for uri in (target, f"unix://{socket_path}"):
            health = subprocess.run([str(cli), "health", f"--target={uri}"],
                                    capture_output=True, text=True,
                                    timeout=60, check=False)
            assert health.returncode == 0, health.stderr
        embed = subprocess.run(
            [str(cli), "embed", f"--target={target}", "--preset=sdxl",
             "--timesteps=999,250,0", "--format=json"],
            capture_output=True, text=True, timeout=60, check=False)
        assert embed.returncode == 0, embed.stderr
        assert np.array_equal(
            np.array(json.loads(embed.stdout)["data"],
                     dtype=np.float32).reshape(3, -1), over_unix)

        # The Python client, in a process of its own (its package name
        # would collide with other tests' generated stubs), on grpcio and,
        # where the build has its extension, on the native transport.
        code = ("import sys, numpy as np; sys.path.insert(0, sys.argv[1]); "
                "import temb; c = temb.Client(sys.argv[2], "
                "transport=sys.argv[3]); assert c.transport == sys.argv[3]; "
                "e = c.embed([999, 250, 0], preset='sdxl'); "
                "sys.stdout.buffer.write(np.asarray(e, '<f4').tobytes())")
        generate_client_stubs(CLIENT_DIR)
        extensions = BIN_DIR.parent / "python"
        transports = ["grpcio"]
        if list(extensions.glob("_temb_transport*")):
            transports.append("native")
        for transport in transports:
            py = subprocess.run(
                [sys.executable, "-c", code, str(CLIENT_DIR), target,
                 transport], capture_output=True, timeout=120, check=False,
                env={**os.environ,
                     "TEMB_LOCAL_EXTENSION_DIR": str(extensions)})
            assert py.returncode == 0, (transport, py.stderr.decode())
            assert py.stdout == over_unix.astype("<f4").tobytes(), transport
    finally:
        srv.stop()
    assert srv.process.returncode == 0
    assert wait_gone(socket_path), "a clean exit removes the socket file"


def test_stale_socket_file_does_not_block_a_restart(tmp_path):
    socket_path = tmp_path / "temb.sock"
    (tmp_path / "a").mkdir()
    first = start(tmp_path / "a", socket_path)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(timeout=10)
    assert socket_path.exists()  # left behind
    (tmp_path / "b").mkdir()
    second = start(tmp_path / "b", socket_path)
    try:
        client = grpcclient.InferenceServerClient(f"unix:{socket_path}")
        assert client.is_server_live()
        client.close()
    finally:
        second.stop()
