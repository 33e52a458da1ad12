"""Fixtures for the REST tests: real temb-server processes serving KServe v2
over HTTP on 127.0.0.1 (ports picked by the OS and read back from
--port_file / --http_port_file), plus throw-away certificates.

Environment (set by tests/rest/CMakeLists.txt): TEMB_SERVER, TEMB_BIN_DIR.
Every wait is bounded.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from temb_testing import BIN_DIR, TembServer  # noqa: E402

SERVER = Path(os.environ.get("TEMB_SERVER") or BIN_DIR / "temb-server")
CURL_TIMEOUT = 30


class RestServer(TembServer):
    """A temb-server with REST on; `http` is "127.0.0.1:PORT"."""

    def __init__(self, workdir, *flags, host="127.0.0.1", **options):
        workdir = Path(workdir)
        http_port_file = workdir / "http_port"
        super().__init__(SERVER, workdir, "--backend=cpu", "--log_level=warn",
                         f"--http_address={host}:0",
                         f"--http_port_file={http_port_file}", *flags,
                         **options)
        deadline = time.monotonic() + 30
        try:
            self.http_port = self._read_port(http_port_file, deadline)
        except RuntimeError:
            self.kill()
            raise
        self.http = f"127.0.0.1:{self.http_port}"
        self.url = f"http://{self.http}"


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    srv = RestServer(tmp_path_factory.mktemp("rest"))
    yield srv
    srv.stop()


@pytest.fixture
def start_server(tmp_path_factory):
    """Factory: start_server(*flags) -> RestServer; all killed at the end."""
    servers = []

    def start(*flags, **options):
        srv = RestServer(tmp_path_factory.mktemp("rest"), *flags, **options)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.kill()


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, timeout=60,
                   capture_output=True)


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """A throw-away CA, a server certificate for 127.0.0.1/localhost and a
    client certificate signed by it.  Paths by name."""
    d = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=temb rest test ca", "-keyout", "ca.key", "-out",
             "ca.pem", cwd=d)
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "extendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj",
                 f"/CN=temb rest test {name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem",
                 "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
                 "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d)
    return {p.name: p for p in d.iterdir()}
