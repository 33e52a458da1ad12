"""Measured numbers a test suite records while it runs and prints after the
run: a conftest imports `measure` (the fixture) and sets its
pytest_terminal_summary to summary("<suite>")."""
from typing import Dict, Tuple

import pytest

# (test, quantity) -> text.
MEASUREMENTS: Dict[Tuple[str, str], str] = {}


@pytest.fixture
def measure(request):
    """measure(quantity, text): records a measured number for the summary."""
    def record(quantity, text):
        MEASUREMENTS[(request.node.name, quantity)] = text
    return record


def summary(suite):
    """A pytest_terminal_summary hook printing what `suite` measured."""
    def pytest_terminal_summary(terminalreporter):
        if not MEASUREMENTS:
            return
        terminalreporter.section(f"measured ({suite})")
        for (test, quantity), text in sorted(MEASUREMENTS.items()):
            terminalreporter.write_line(f"{test}  {quantity}: {text}")
    return pytest_terminal_summary
