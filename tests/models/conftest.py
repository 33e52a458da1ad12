"""Fixtures for the model parity suite: the Python client from source, one
real temb-server for the session, and a table of measured errors printed at
the end of the run.

Environment (set by tests/models/CMakeLists.txt under ctest):
  TEMB_SERVER_BIN  the temb-server binary (required; the tests skip without it)
  TEMB_CLIENT_DIR  client/python (default: found relative to this file)

The suite runs diffusers' own code (torch and diffusers from
scripts/requirements-dev.txt) and skips as a whole where they are missing.
Nothing is installed: the gRPC stubs are generated into the (git-ignored)
client/python/temb/_proto by `setup.py build_proto --inplace`, as for
tests/python.
"""

import os
import pathlib
import subprocess
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CLIENT_DIR = pathlib.Path(
    os.environ.get("TEMB_CLIENT_DIR", REPO_ROOT / "client" / "python")).resolve()


def _generate_stubs() -> None:
    stamp = CLIENT_DIR / "temb" / "_proto" / "__init__.py"
    sources = [CLIENT_DIR / "setup.py", CLIENT_DIR.parents[1] / "CMakeLists.txt",
               CLIENT_DIR.parents[1] / "proto" / "temb" / "v1" / "temb.proto"]
    if stamp.exists() and all(
            not s.exists() or s.stat().st_mtime <= stamp.stat().st_mtime
            for s in sources):
        return
    subprocess.run([sys.executable, "setup.py", "-q", "build_proto", "--inplace"],
                   cwd=CLIENT_DIR, check=True, timeout=300)


_generate_stubs()
sys.path.insert(0, str(CLIENT_DIR))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "pylib"))

import temb  # noqa: E402  (needs the stubs and the path above)
from temb_testing import TembServer  # noqa: E402

# Filled by the tests: (test, quantity) -> text, printed after the run.
MEASUREMENTS = {}


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    binary = os.environ.get("TEMB_SERVER_BIN")
    if not binary:
        pytest.skip("TEMB_SERVER_BIN is not set (run through ctest, or set it "
                    "to a temb-server binary)")
    if not pathlib.Path(binary).is_file():
        pytest.fail(f"TEMB_SERVER_BIN={binary} does not exist: build the "
                    "temb-server target first")
    try:
        process = TembServer(binary, tmp_path_factory.mktemp("server"),
                             "--backend=cpu", start_timeout=60)
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


@pytest.fixture
def measure(request):
    """measure(quantity, text): records a measured number for the summary."""
    def record(quantity, text):
        MEASUREMENTS[(request.node.name, quantity)] = text
    return record


def pytest_terminal_summary(terminalreporter):
    if not MEASUREMENTS:
        return
    terminalreporter.section("measured (tests/models)")
    for (test, quantity), text in sorted(MEASUREMENTS.items()):
        terminalreporter.write_line(f"{test}  {quantity}: {text}")
