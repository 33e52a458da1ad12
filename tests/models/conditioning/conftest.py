"""Fixtures for the conditioning parity tests: the temb CLI and a table of
measured agreement printed at the end of the run.

Environment (set by tests/models/CMakeLists.txt under ctest):
  TEMB_CLI_BIN  the temb binary (the tests skip without it)
"""

import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "pylib"))
from measurements import measure, summary  # noqa: E402,F401

pytest_terminal_summary = summary("tests/models/conditioning")


@pytest.fixture(scope="module")
def temb_cli():
    value = os.environ.get("TEMB_CLI_BIN")
    if not value:
        pytest.skip("TEMB_CLI_BIN is not set (run through ctest, or set it to "
                    "a temb binary)")
    path = pathlib.Path(value)
    if not path.is_file():
        pytest.fail(f"TEMB_CLI_BIN={value} does not exist: build the temb "
                    "target first")
    return path
