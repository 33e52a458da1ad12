"""Fixtures for the Python client tests: the client package from source and a
real temb-server on 127.0.0.1:0.

Environment (set by tests/python/CMakeLists.txt under ctest):
  TEMB_SERVER_BIN  the temb-server binary (required; the tests skip without it)
  TEMB_CLI_BIN     the temb CLI (optional; the CLI parity tests skip without it)
  TEMB_CLIENT_DIR  client/python (default: found relative to this file)
  TEMB_TRANSPORT   grpcio|native: the transport of temb.Client's "auto"

Nothing is installed: the gRPC stubs are generated into the (git-ignored)
client/python/temb/_proto by cmake/TembPythonStubs.cmake when missing or
older than their sources, and client/python is put first on sys.path.
"""

import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "pylib"))
# The session's server, client and server info come from the shared suite.
from temb_client_suite import (CLIENT_DIR, binary_from_env,  # noqa: E402,F401
                               client, info, server, server_binary,
                               use_client_from_source)

use_client_from_source()
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

import temb  # noqa: E402,F401  (needs the stubs and the path above)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: builds and installs the package in a fresh virtualenv")


@pytest.fixture(scope="session")
def client_dir():
    return CLIENT_DIR


@pytest.fixture(scope="session")
def cli_binary():
    binary = binary_from_env("TEMB_CLI_BIN")
    if binary is None:
        pytest.skip("TEMB_CLI_BIN does not name the temb CLI binary: it was not "
                    "built, so the CLI parity checks cannot run")
    return binary
