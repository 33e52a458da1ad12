"""Shared helpers for the end-to-end tests: the real temb-server, driven by
the real temb CLI (and, for requests the CLI cannot express, raw gRPC).

Binaries come from $TEMB_BIN_DIR (set by ctest), else <repo>/build/bin.
"""
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from temb_testing import (BIN_DIR, TembServer, generate_stubs,  # noqa: E402
                          cli_arguments, server_factory)

TEMB = BIN_DIR / "temb"
SERVER = BIN_DIR / "temb-server"


def temb(*args, timeout=60, stdout=subprocess.PIPE):
    """Runs the temb CLI; returns the CompletedProcess (bytes output)."""
    return subprocess.run([str(TEMB), *cli_arguments(args)], stdout=stdout,
                          stderr=subprocess.PIPE, timeout=timeout, check=False)


@pytest.fixture
def start_server(tmp_path_factory):
    """Factory: start_server(*flags) -> TembServer; every server is killed at
    the end of the test whatever happens."""
    yield from server_factory(tmp_path_factory, SERVER, "--log_level=warn")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One default server for a whole test module."""
    s = TembServer(SERVER, tmp_path_factory.mktemp("server"), "--log_level=warn")
    yield s
    s.kill()


@pytest.fixture(scope="session")
def pb(tmp_path_factory):
    """Python modules generated from proto/temb/v1/temb.proto."""
    generate_stubs(tmp_path_factory.mktemp("pb"), "temb/v1/temb.proto")
    from temb.v1 import temb_pb2, temb_pb2_grpc  # noqa: E402
    return temb_pb2, temb_pb2_grpc
