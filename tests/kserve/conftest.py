"""Fixtures for the KServe v2 tests: a real temb-server and clients for it.

Environment (set by tests/kserve/CMakeLists.txt):
  TEMB_SERVER     path of the temb-server binary
  TEMB_PROTO_DIR  the repository's proto/ directory (native API stubs)
"""

import sys

import grpc
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2_grpc

from server_process import Server, require_env


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def client(server):
    c = triton.InferenceServerClient(server.address)
    yield c
    c.close()


@pytest.fixture(scope="session")
def channel(server):
    with grpc.insecure_channel(server.address) as ch:
        yield ch


@pytest.fixture(scope="session")
def kserve_stub(channel):
    """Raw access with tritonclient's own copy of the protocol's messages,
    for requests that tritonclient's helpers never build."""
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(scope="session")
def native(tmp_path_factory, channel):
    """(temb_pb2, stub) for the native temb.v1 API, generated at test time."""
    from grpc_tools import protoc  # pylint: disable=import-outside-toplevel

    out = tmp_path_factory.mktemp("native_stubs")
    proto_dir = require_env("TEMB_PROTO_DIR")
    # Generated under a private top-level name so that it cannot collide
    # with an installed `temb` Python package; the wire names stay temb.v1.
    rc = protoc.main(["protoc", f"-Ikserve_native={proto_dir}",
                      f"--python_out={out}", f"--grpc_python_out={out}",
                      f"{proto_dir}/temb/v1/temb.proto"])
    assert rc == 0, "protoc failed on temb/v1/temb.proto"
    sys.path.insert(0, str(out))
    # pylint: disable=import-outside-toplevel
    from kserve_native.temb.v1 import temb_pb2, temb_pb2_grpc
    return temb_pb2, temb_pb2_grpc.EmbeddingServiceStub(channel)
