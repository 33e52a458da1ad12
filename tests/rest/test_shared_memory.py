"""Triton's system shared memory extension over REST and gRPC, driven by
tritonclient.utils.shared_memory (POSIX shm regions the clients create) and
by `perf_analyzer --shared-memory system`: inputs read from a region,
outputs written into one, the same numbers as plain requests, and the
register / status / unregister calls with their errors."""
import json
import subprocess
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from test_curl import curl
from temb_perf_analyzer import find_perf_analyzer, perf_analyzer_env

STEPS = np.array([[999.0], [500.0], [1.0], [0.0]], dtype=np.float32)
OUT_BYTES = STEPS.shape[0] * 320 * 4


@pytest.fixture
def regions():
    """An input region holding STEPS and an output region; unlinked after."""
    tag = uuid.uuid4().hex[:8]
    inp = shm.create_shared_memory_region(f"in-{tag}", f"/temb-in-{tag}",
                                          STEPS.nbytes)
    out = shm.create_shared_memory_region(f"out-{tag}", f"/temb-out-{tag}",
                                          OUT_BYTES + 64)
    shm.set_shared_memory_region(inp, [STEPS])
    yield {"in": (f"in-{tag}", f"/temb-in-{tag}", inp),
           "out": (f"out-{tag}", f"/temb-out-{tag}", out)}
    shm.destroy_shared_memory_region(inp)
    shm.destroy_shared_memory_region(out)


def expected(server):
    client = grpcclient.InferenceServerClient(server.target)
    inp = grpcclient.InferInput("TIMESTEP", list(STEPS.shape), "FP32")
    inp.set_data_from_numpy(STEPS)
    result = client.infer("sd15", [inp]).as_numpy("EMBEDDING")
    client.close()
    return result


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_in_shared_memory(server, regions, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(
        server.http if protocol == "http" else server.target)
    in_name, in_key, _ = regions["in"]
    out_name, out_key, out_handle = regions["out"]
    try:
        client.register_system_shared_memory(in_name, in_key, STEPS.nbytes)
        client.register_system_shared_memory(out_name, out_key,
                                             OUT_BYTES + 64)
        status = client.get_system_shared_memory_status()
        names = ({r["name"] for r in status} if protocol == "http"
                 else set(status.regions))
        assert {in_name, out_name} <= names

        inp = module.InferInput("TIMESTEP", list(STEPS.shape), "FP32")
        inp.set_shared_memory(in_name, STEPS.nbytes)
        out = module.InferRequestedOutput("EMBEDDING")
        out.set_shared_memory(out_name, OUT_BYTES + 64, offset=0)
        result = client.infer("sd15", [inp], outputs=[out])
        output = result.get_output("EMBEDDING")
        if protocol == "http":
            # As Triton: the output's metadata, no data, no parameters.
            assert set(output) == {"name", "datatype", "shape"}, output
            shape = output["shape"]
        else:
            params = {k: v.string_param or v.int64_param
                      for k, v in output.parameters.items()}
            assert params["shared_memory_region"] == out_name
            assert params["shared_memory_byte_size"] == OUT_BYTES
            shape = list(output.shape)
        got = shm.get_contents_as_numpy(out_handle, np.float32, shape)
        assert np.array_equal(got, expected(server))

        # An output region too small for the answer: 400 / INVALID_ARGUMENT.
        small = module.InferRequestedOutput("EMBEDDING")
        small.set_shared_memory(out_name, 16)
        with pytest.raises(InferenceServerException) as error:
            client.infer("sd15", [inp], outputs=[small])
        assert "shared_memory_byte_size" in error.value.message()
        # A region nobody registered.
        ghost = module.InferInput("TIMESTEP", list(STEPS.shape), "FP32")
        ghost.set_shared_memory("ghost", STEPS.nbytes)
        with pytest.raises(InferenceServerException) as error:
            client.infer("sd15", [ghost])
        assert "ghost" in error.value.message()
    finally:
        client.unregister_system_shared_memory()
        status = client.get_system_shared_memory_status()
        assert len(status if protocol == "http" else status.regions) == 0
        client.close()


def test_register_errors_and_curl(server, regions):
    in_name, in_key, _ = regions["in"]
    base = server.url + "/v2/systemsharedmemory"
    register = base + f"/region/{in_name}/register"
    body = json.dumps({"key": in_key, "offset": 0,
                       "byte_size": STEPS.nbytes}).encode()
    assert curl(register, method="POST", data=body)[0] == 200
    status, _, answer = curl(base + f"/region/{in_name}/status")
    assert status == 200
    assert json.loads(answer) == [{"name": in_name, "key": in_key,
                                   "offset": 0, "byte_size": STEPS.nbytes}]
    assert curl(register, method="POST", data=body)[0] == 409
    too_big = json.dumps({"key": in_key, "byte_size": 1 << 30}).encode()
    assert curl(base + "/region/x/register", method="POST",
                data=too_big)[0] == 400
    missing = json.dumps({"key": "/temb-no-such-object",
                          "byte_size": 8}).encode()
    assert curl(base + "/region/y/register", method="POST",
                data=missing)[0] == 404
    assert curl(base + "/region/z/register", method="POST",
                data=b"{")[0] == 400
    assert curl(base + f"/region/{in_name}/unregister", method="POST",
                data=b"")[0] == 200
    assert curl(base + f"/region/{in_name}/unregister", method="POST",
                data=b"")[0] == 404
    assert curl(base + "/status")[0] == 200
    assert curl(base + "/status", method="POST", data=b"")[0] == 405
    # CUDA shared memory: nothing to register, unregistering all is fine.
    cuda = server.url + "/v2/cudasharedmemory"
    assert curl(cuda + "/unregister", method="POST", data=b"")[0] == 200
    assert json.loads(curl(cuda + "/status")[2]) == []
    assert curl(cuda + "/region/g/register", method="POST",
                data=b"{}")[0] == 400


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_shared_memory_system(server, tmp_path, protocol):
    data = tmp_path / "timesteps.json"
    data.write_text(json.dumps(
        {"data": [{"TIMESTEP": [t]} for t in (999.0, 500.0, 1.0)]}))
    url = server.http if protocol == "http" else server.target
    command = [find_perf_analyzer(), "-i", protocol, "-u", url, "-m", "sd15",
               "-b", "4", "--concurrency-range", "2", "--input-data",
               str(data), "--shared-memory", "system",
               "--output-shared-memory-size", str(4 * 320 * 4),
               "--measurement-interval", "1000",
               "--stability-percentage", "100"]
    run = subprocess.run(command, env=perf_analyzer_env(),
                         capture_output=True, text=True, timeout=180,
                         check=False)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    assert "Concurrency: 2, throughput:" in report, report
    assert "Server:" in report, report
