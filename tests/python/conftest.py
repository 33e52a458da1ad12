"""Fixtures for the Python client tests: the client package from source and a
real temb-server on 127.0.0.1:0.

Environment (set by tests/python/CMakeLists.txt under ctest):
  TEMB_SERVER_BIN  the temb-server binary (required; the tests skip without it)
  TEMB_CLI_BIN     the temb CLI (optional; the CLI parity tests skip without it)
  TEMB_CLIENT_DIR  client/python (default: found relative to this file)
  TEMB_TRANSPORT   grpcio|native: the transport of temb.Client's "auto"

Nothing is installed: the gRPC stubs are generated into the (git-ignored)
client/python/temb/_proto by `setup.py build_proto --inplace` when missing or
older than their sources, and client/python is put first on sys.path.
"""

import os
import pathlib
import subprocess
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CLIENT_DIR = pathlib.Path(
    os.environ.get("TEMB_CLIENT_DIR", REPO_ROOT / "client" / "python")).resolve()
SERVER_START_SECONDS = 60


def _generate_stubs() -> None:
    stamp = CLIENT_DIR / "temb" / "_proto" / "__init__.py"
    sources = [CLIENT_DIR / "setup.py", CLIENT_DIR.parents[1] / "CMakeLists.txt",
               CLIENT_DIR.parents[1] / "proto" / "temb" / "v1" / "temb.proto"]
    if stamp.exists() and all(
            s.stat().st_mtime <= stamp.stat().st_mtime for s in sources):
        return
    subprocess.run([sys.executable, "setup.py", "-q", "build_proto", "--inplace"],
                   cwd=CLIENT_DIR, check=True, timeout=300)


_generate_stubs()
# The native extensions (temb.local's engine, temb.Client's C++ transport)
# of the build under test: <build>/python next to <build>/bin/temb-server.
# A build without them (sanitized, or TEMB_BUILD_PYTHON_EXTENSION=OFF) has
# no such directory: temb.local's tests then skip and temb.Client uses
# grpcio.
if not os.environ.get("TEMB_LOCAL_EXTENSION_DIR") and os.environ.get(
        "TEMB_SERVER_BIN"):
    os.environ["TEMB_LOCAL_EXTENSION_DIR"] = str(
        pathlib.Path(os.environ["TEMB_SERVER_BIN"]).resolve().parents[1]
        / "python")
sys.path.insert(0, str(CLIENT_DIR))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "pylib"))

import temb  # noqa: E402  (needs the stubs and the path above)
from temb_testing import TembServer  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: builds and installs the package in a fresh virtualenv")


def _binary(variable):
    value = os.environ.get(variable)
    return pathlib.Path(value) if value and pathlib.Path(value).is_file() else None


@pytest.fixture(scope="session")
def server_binary():
    if not os.environ.get("TEMB_SERVER_BIN"):
        pytest.skip("TEMB_SERVER_BIN is not set (run through ctest, or set it "
                    "to a temb-server binary)")
    binary = _binary("TEMB_SERVER_BIN")
    if binary is None:  # configured but not built: a broken setup, not a skip
        pytest.fail(f"TEMB_SERVER_BIN={os.environ['TEMB_SERVER_BIN']} does not "
                    "exist: build the temb-server target first")
    return binary


@pytest.fixture(scope="session")
def server(server_binary, tmp_path_factory):
    try:
        process = TembServer(server_binary, tmp_path_factory.mktemp("server"),
                             "--backend=cpu",
                             start_timeout=SERVER_START_SECONDS)
    except RuntimeError as error:
        pytest.fail(str(error))
    yield process
    process.stop(timeout=15)


@pytest.fixture(scope="session")
def client(server):
    with temb.Client(server.target, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def info(client):
    return client.server_info()


@pytest.fixture(scope="session")
def client_dir():
    return CLIENT_DIR


@pytest.fixture(scope="session")
def cli_binary():
    binary = _binary("TEMB_CLI_BIN")
    if binary is None:
        pytest.skip("TEMB_CLI_BIN does not name the temb CLI binary: it was not "
                    "built, so the CLI parity checks cannot run")
    return binary
