"""Fixtures for the conditioning parity tests: the temb CLI and a table of
measured agreement printed at the end of the run.

Environment (set by tests/models/CMakeLists.txt under ctest):
  TEMB_CLI_BIN  the temb binary (the tests skip without it)
"""

import os
import pathlib

import pytest

MEASUREMENTS = {}


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


@pytest.fixture
def measure(request):
    """measure(quantity, text): records a measured number for the summary."""
    def record(quantity, text):
        MEASUREMENTS[(request.node.name, quantity)] = text
    return record


def pytest_terminal_summary(terminalreporter):
    if not MEASUREMENTS:
        return
    terminalreporter.section("measured (tests/models/conditioning)")
    for (test, quantity), text in sorted(MEASUREMENTS.items()):
        terminalreporter.write_line(f"{test}  {quantity}: {text}")
