"""Fixtures for the KServe v2 tests: a real temb-server and clients for it.

Environment (set by tests/kserve/CMakeLists.txt):
  TEMB_SERVER     path of the temb-server binary
  TEMB_PROTO_DIR  the repository's proto/ directory (native API stubs)
"""

import os
import sys
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from temb_testing import TembServer, generate_stubs  # noqa: E402


def require_env(name):
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set; run these tests through ctest")
    return value


def start_server(workdir, *flags):
    """A temb-server on the CPU backend, 127.0.0.1 and a port it picked."""
    return TembServer(require_env("TEMB_SERVER"), workdir, "--backend=cpu",
                      *flags)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def client(server):
    c = triton.InferenceServerClient(server.target)
    yield c
    c.close()


@pytest.fixture(scope="session")
def channel(server):
    with grpc.insecure_channel(server.target) as ch:
        yield ch


@pytest.fixture(scope="session")
def kserve_stub(channel):
    """Raw access with tritonclient's own copy of the protocol's messages,
    for requests that tritonclient's helpers never build."""
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(scope="session")
def native(tmp_path_factory, channel):
    """(temb_pb2, stub) for the native temb.v1 API, generated at test time."""
    # Under a private top-level name so that it cannot collide with an
    # installed `temb` Python package; the wire names stay temb.v1.
    generate_stubs(tmp_path_factory.mktemp("native_stubs"),
                   "temb/v1/temb.proto", prefix="kserve_native",
                   proto_dir=require_env("TEMB_PROTO_DIR"))
    # pylint: disable=import-outside-toplevel
    from kserve_native.temb.v1 import temb_pb2, temb_pb2_grpc
    return temb_pb2, temb_pb2_grpc.EmbeddingServiceStub(channel)
