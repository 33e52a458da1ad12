"""Fixtures for the model parity suite: the Python client from source, one
real temb-server for the session, and a table of measured errors printed at
the end of the run.

Environment (set by tests/models/CMakeLists.txt under ctest):
  TEMB_SERVER_BIN  the temb-server binary (required; the tests skip without it)
  TEMB_CLIENT_DIR  client/python (default: found relative to this file)

The suite runs diffusers' own code (torch and diffusers from
scripts/requirements-dev.txt) and skips as a whole where they are missing.
Nothing is installed: the gRPC stubs are generated into the (git-ignored)
client/python/temb/_proto by cmake/TembPythonStubs.cmake, as for
tests/python.
"""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "pylib"))
# The session's server, client and server info come from the shared suite.
from temb_client_suite import (client, info, server,  # noqa: E402,F401
                               server_binary, use_client_from_source)

use_client_from_source()

import temb  # noqa: E402,F401  (needs the stubs and the path above)

from measurements import measure, summary  # noqa: E402,F401

pytest_terminal_summary = summary("tests/models")
