"""The temb Python client from source, for the suites that drive it against
a real server (tests/python, tests/models), and their session fixtures.

Nothing is installed: `use_client_from_source()` generates the gRPC stubs
into the (git-ignored) client/python/temb/_proto with
cmake/TembPythonStubs.cmake (as the package's build does) when they are
missing or older than their sources, and puts client/python first on
sys.path.  A conftest calls it before importing
`temb` and imports the fixtures it uses by name.

Environment (set by the suites' CMakeLists.txt under ctest):
  TEMB_SERVER_BIN  the temb-server binary (required; the tests skip without it)
  TEMB_CLIENT_DIR  client/python (default: found relative to this file)
"""
import os
import pathlib
import sys

import pytest

from temb_testing import REPO, TembServer, generate_client_stubs

CLIENT_DIR = pathlib.Path(
    os.environ.get("TEMB_CLIENT_DIR", REPO / "client" / "python")).resolve()
SERVER_START_SECONDS = 60


def use_client_from_source():
    generate_client_stubs(CLIENT_DIR)
    sys.path.insert(0, str(CLIENT_DIR))


def binary_from_env(variable):
    """The file that $`variable` names, or None."""
    value = os.environ.get(variable)
    return (pathlib.Path(value) if value and pathlib.Path(value).is_file()
            else None)


@pytest.fixture(scope="session")
def server_binary():
    if not os.environ.get("TEMB_SERVER_BIN"):
        pytest.skip("TEMB_SERVER_BIN is not set (run through ctest, or set it "
                    "to a temb-server binary)")
    binary = binary_from_env("TEMB_SERVER_BIN")
    if binary is None:  # configured but not built: a broken setup, not a skip
        pytest.fail(f"TEMB_SERVER_BIN={os.environ['TEMB_SERVER_BIN']} does "
                    "not exist: build the temb-server target first")
    return binary


@pytest.fixture(scope="session")
def server(server_binary, tmp_path_factory):  # pylint: disable=redefined-outer-name
    """One temb-server on the CPU backend for the session."""
    try:
        process = TembServer(server_binary, tmp_path_factory.mktemp("server"),
                             "--backend=cpu",
                             start_timeout=SERVER_START_SECONDS)
    except RuntimeError as error:
        pytest.fail(str(error))
    yield process
    process.stop(timeout=15)


@pytest.fixture(scope="session")
def client(server):  # pylint: disable=redefined-outer-name
    import temb  # pylint: disable=import-outside-toplevel
    with temb.Client(server.target, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def info(client):  # pylint: disable=redefined-outer-name
    return client.server_info()
