"""Helpers for the reliability tests: real temb-server processes on
127.0.0.1 (port 0, read back from --port_file), their Prometheus metrics and
memory, raw gRPC stubs, and throw-away certificates made with openssl.

Binaries come from $TEMB_BIN_DIR (set by ctest), else <repo>/build/bin.
Every wait is bounded.
"""
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("TEMB_BIN_DIR", REPO / "build" / "bin"))
TEMB = BIN_DIR / "temb"
SERVER = BIN_DIR / "temb-server"

_SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})?\s+(\S+)$")


def temb(*args, timeout=120):
    """Runs the temb CLI; returns the CompletedProcess (text output)."""
    return subprocess.run([str(TEMB), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, check=False)


class Server:
    """A temb-server on 127.0.0.1 with OS-picked gRPC and metrics ports."""

    def __init__(self, workdir, *flags):
        workdir = Path(workdir)
        port_file, metrics_file = workdir / "port", workdir / "metrics_port"
        self.log_path = workdir / "server.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [str(SERVER), "--address=127.0.0.1:0", f"--port_file={port_file}",
             "--metrics_address=127.0.0.1:0",
             f"--metrics_port_file={metrics_file}", "--log_level=warn",
             *flags],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not all(p.exists() and p.read_text().strip()
                      for p in (port_file, metrics_file)):
            if self.process.poll() is not None:
                raise RuntimeError(f"temb-server exited early:\n{self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"temb-server did not start:\n{self.log()}")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        self.metrics_port = int(metrics_file.read_text())
        self.target = f"127.0.0.1:{self.port}"

    def log(self):
        return self.log_path.read_text(errors="replace")

    def rss_bytes(self):
        """Resident memory now, from /proc/PID/status (VmRSS, in kB)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) * 1024

    def metrics(self):
        """{(name, frozenset(labels)): value} from /metrics."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        samples = {}
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if match and not line.startswith("#"):
                labels = frozenset(re.findall(r'(\w+)="([^"]*)"',
                                              match.group(2) or ""))
                samples[(match.group(1), labels)] = float(match.group(3))
        return samples

    def metric(self, name, **labels):
        """The sum of the samples of `name` whose labels include `labels`."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.metrics().items()
                   if n == name and wanted <= ls)

    def alive(self):
        return self.process.poll() is None

    def terminate(self, timeout=60):
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self._log.close()


@pytest.fixture
def start_server(tmp_path_factory):
    """Factory: start_server(*flags) -> Server; all killed at the end."""
    servers = []

    def start(*flags):
        server = Server(tmp_path_factory.mktemp("server"), *flags)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill()


@pytest.fixture(scope="session")
def pb(tmp_path_factory):
    """(temb_pb2, temb_pb2_grpc, grpc_service_pb2, grpc_service_pb2_grpc)
    generated from the repository's protos."""
    out = tmp_path_factory.mktemp("pb")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO / 'proto'}",
         f"--python_out={out}", f"--grpc_python_out={out}",
         "temb/v1/temb.proto", "inference/grpc_service.proto",
         "inference/model_config.proto"], check=True, timeout=120)
    for package in (out / "temb", out / "temb" / "v1", out / "inference"):
        (package / "__init__.py").touch()
    sys.path.insert(0, str(out))
    from temb.v1 import temb_pb2, temb_pb2_grpc  # noqa: E402
    from inference import grpc_service_pb2, grpc_service_pb2_grpc  # noqa: E402
    return temb_pb2, temb_pb2_grpc, grpc_service_pb2, grpc_service_pb2_grpc


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, timeout=60,
                   capture_output=True)


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """A throw-away CA, a server certificate for 127.0.0.1/localhost and a
    client certificate, both signed by the CA; plus a second CA that signed
    nothing the server trusts.  Paths by name."""
    d = tmp_path_factory.mktemp("certs")
    for ca in ("ca", "other_ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                 "-subj", f"/CN=temb test {ca}", "-keyout", f"{ca}.key",
                 "-out", f"{ca}.pem", cwd=d)
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "extendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, ca in (("server", "ca"), ("client", "ca"),
                     ("rogue_client", "other_ca")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj",
                 f"/CN=temb test {name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        ext = "server.ext" if name == "server" else "client.ext"
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem",
                 "-CAkey", f"{ca}.key", "-CAcreateserial", "-days", "2",
                 "-extfile", ext, "-out", f"{name}.pem", cwd=d)
    return {p.stem if p.suffix == ".pem" else p.name: p
            for p in d.iterdir()}
