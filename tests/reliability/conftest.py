"""Helpers for the reliability tests: real temb-server processes on
127.0.0.1 (port 0, read back from --port_file), their Prometheus metrics and
memory, raw gRPC stubs, and throw-away certificates made with openssl.

Binaries come from $TEMB_BIN_DIR (set by ctest), else <repo>/build/bin.
Every wait is bounded.
"""
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from temb_testing import (BIN_DIR, REPO, generate_stubs,  # noqa: E402,F401
                          cli_arguments, server_factory)

TEMB = BIN_DIR / "temb"
SERVER = BIN_DIR / "temb-server"


def temb(*args, timeout=120):
    """Runs the temb CLI; returns the CompletedProcess (text output)."""
    return subprocess.run([str(TEMB), *cli_arguments(args)],
                          capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.fixture
def start_server(tmp_path_factory):
    """Factory: start_server(*flags) -> TembServer with OS-picked gRPC and
    metrics ports; all killed at the end."""
    yield from server_factory(tmp_path_factory, SERVER, "--log_level=warn",
                              metrics=True)


@pytest.fixture(scope="session")
def pb(tmp_path_factory):
    """(temb_pb2, temb_pb2_grpc, grpc_service_pb2, grpc_service_pb2_grpc)
    generated from the repository's protos."""
    generate_stubs(tmp_path_factory.mktemp("pb"), "temb/v1/temb.proto",
                   "inference/grpc_service.proto",
                   "inference/model_config.proto")
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
