"""Shared helpers for the end-to-end tests: the real temb-server, driven by
the real temb CLI (and, for requests the CLI cannot express, raw gRPC).

Binaries come from $TEMB_BIN_DIR (set by ctest), else <repo>/build/bin.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("TEMB_BIN_DIR", REPO / "build" / "bin"))
TEMB = BIN_DIR / "temb"
SERVER = BIN_DIR / "temb-server"


def temb(*args, timeout=60, stdout=subprocess.PIPE):
    """Runs the temb CLI; returns the CompletedProcess (bytes output)."""
    return subprocess.run([str(TEMB), *map(str, args)], stdout=stdout,
                          stderr=subprocess.PIPE, timeout=timeout, check=False)


class Server:
    """A temb-server on 127.0.0.1 with an OS-picked port."""

    def __init__(self, workdir, *flags):
        self.port_file = Path(workdir) / "port"
        self.log_path = Path(workdir) / "server.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [str(SERVER), "--address=127.0.0.1:0",
             f"--port_file={self.port_file}", "--metrics_address=",
             "--log_level=warn", *flags],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not (self.port_file.exists() and self.port_file.read_text().strip()):
            if self.process.poll() is not None:
                raise RuntimeError(f"temb-server exited early:\n{self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"temb-server did not start:\n{self.log()}")
            time.sleep(0.05)
        self.port = int(self.port_file.read_text().strip())
        self.target = f"127.0.0.1:{self.port}"

    def log(self):
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout=30):
        """SIGTERM, then waits; returns the exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self._log.close()


@pytest.fixture
def start_server(tmp_path_factory):
    """Factory: start_server(*flags) -> Server; every server is killed at
    the end of the test whatever happens."""
    servers = []

    def start(*flags):
        server = Server(tmp_path_factory.mktemp("server"), *flags)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One default server for a whole test module."""
    s = Server(tmp_path_factory.mktemp("server"))
    yield s
    s.kill()


@pytest.fixture(scope="session")
def pb(tmp_path_factory):
    """Python modules generated from proto/temb/v1/temb.proto."""
    out = tmp_path_factory.mktemp("pb")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO / 'proto'}",
         f"--python_out={out}", f"--grpc_python_out={out}",
         "temb/v1/temb.proto"], check=True, timeout=60)
    # Regular packages, so that an installed `temb` Python client cannot
    # shadow the generated modules.
    for package in (out / "temb", out / "temb" / "v1"):
        (package / "__init__.py").touch()
    sys.path.insert(0, str(out))
    from temb.v1 import temb_pb2, temb_pb2_grpc  # noqa: E402
    return temb_pb2, temb_pb2_grpc
