"""tritonclient.http (Triton's own Python client) against temb's REST port:
it must work unchanged and get exactly the numbers the gRPC port gives."""
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def http(server):
    client = httpclient.InferenceServerClient(server.http)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server):
    client = grpcclient.InferenceServerClient(server.target)
    yield client
    client.close()


def http_input(values, datatype="FP32", binary=True, shape=None):
    array = np.asarray(values, dtype=np.float32 if datatype == "FP32"
                       else np.int64)
    if shape is None:
        array = array.reshape(-1, 1)
    inp = httpclient.InferInput("TIMESTEP", list(array.shape), datatype)
    inp.set_data_from_numpy(array, binary_data=binary)
    return inp


def grpc_result(grpc, model, values, parameters=None):
    array = np.asarray(values, dtype=np.float32).reshape(-1, 1)
    inp = grpcclient.InferInput("TIMESTEP", list(array.shape), "FP32")
    inp.set_data_from_numpy(array)
    return grpc.infer(model, [inp], parameters=parameters)


def test_health_and_metadata(http):
    assert http.is_server_live()
    assert http.is_server_ready()
    assert http.is_model_ready("flux")
    assert http.is_model_ready("flux", "1")
    assert not http.is_model_ready("nope")
    assert not http.is_model_ready("flux", "2")
    meta = http.get_server_metadata()
    assert meta["name"] == "temb" and "statistics" in meta["extensions"]
    model = http.get_model_metadata("flux")
    assert model["outputs"][0]["shape"] == [-1, 256]
    config = http.get_model_config("flux")
    assert config["input"][0]["name"] == "TIMESTEP"
    assert config["max_batch_size"] > 0


@pytest.mark.parametrize("model", ["sd15", "sdxl-add-time", "flux", "ddpm",
                                   "dit-diffusers", "wan"])
@pytest.mark.parametrize("binary_in,binary_out", [(True, True),
                                                  (False, False),
                                                  (True, False)])
def test_same_numbers_as_grpc(http, grpc, model, binary_in, binary_out):
    steps = [999.0, 500.5, 1.0, 0.0]
    out = httpclient.InferRequestedOutput("EMBEDDING", binary_data=binary_out)
    result = http.infer(model, [http_input(steps, binary=binary_in)],
                        outputs=[out], request_id="rest-1")
    assert result.get_response()["id"] == "rest-1"
    expected = grpc_result(grpc, model, steps).as_numpy("EMBEDDING")
    got = result.as_numpy("EMBEDDING")
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.array_equal(got, expected)


def test_default_outputs_come_back_binary(http, grpc):
    # No outputs named: tritonclient asks binary_data_output for all.
    result = http.infer("sd21", [http_input([10, 20])])
    (output,) = result.get_response()["outputs"]
    assert output["parameters"]["binary_data_size"] == 2 * 320 * 4
    assert np.array_equal(result.as_numpy("EMBEDDING"),
                          grpc_result(grpc, "sd21", [10, 20])
                          .as_numpy("EMBEDDING"))


def test_int64_timesteps(http, grpc):
    result = http.infer("ddpm", [http_input([999, 0], datatype="INT64")])
    assert np.array_equal(result.as_numpy("EMBEDDING"),
                          grpc_result(grpc, "ddpm", [999, 0])
                          .as_numpy("EMBEDDING"))


@pytest.mark.parametrize("dtype", ["FP16", "BF16", "FP64"])
def test_output_dtypes_match_grpc_bit_for_bit(http, grpc, dtype):
    params = {"dtype": dtype}
    out = httpclient.InferRequestedOutput("EMBEDDING", binary_data=True)
    result = http.infer("sdxl", [http_input([999, 3])], outputs=[out],
                        parameters=params)
    assert result.get_output("EMBEDDING")["datatype"] == dtype
    expected = grpc_result(grpc, "sdxl", [999, 3], params)
    raw = expected.get_response().raw_output_contents[0]
    got = result.as_numpy("EMBEDDING")
    if dtype == "BF16":
        # Both clients widen BF16 to float32; compare the bit patterns.
        bits = (np.ascontiguousarray(got).view(np.uint32) >> 16)
        assert np.array_equal(bits.astype("<u2").tobytes(), raw)
    else:
        assert got.tobytes() == raw


def test_bf16_as_json_is_refused(http):
    out = httpclient.InferRequestedOutput("EMBEDDING", binary_data=False)
    with pytest.raises(InferenceServerException) as error:
        http.infer("sdxl", [http_input([1])], outputs=[out],
                   parameters={"dtype": "BF16"})
    assert error.value.status() == "400"
    assert "binary" in error.value.message()


def test_parameters_dim(http, grpc):
    result = http.infer("transformer", [http_input([7])],
                        parameters={"dim": 64})
    assert result.as_numpy("EMBEDDING").shape == (1, 64)
    assert np.array_equal(result.as_numpy("EMBEDDING"),
                          grpc_result(grpc, "transformer", [7], {"dim": 64})
                          .as_numpy("EMBEDDING"))


def test_errors_carry_status_and_message(http):
    with pytest.raises(InferenceServerException) as error:
        http.infer("nope", [http_input([1])])
    assert error.value.status() == "404"
    assert "unknown model" in error.value.message()
    with pytest.raises(InferenceServerException) as error:
        http.infer("sd15", [http_input([float("nan")])])
    assert error.value.status() == "400"
    assert "timesteps[0]" in error.value.message()
    with pytest.raises(InferenceServerException) as error:
        http.get_model_metadata("sd15", "9")
    assert error.value.status() == "404"


def test_statistics_count_http_and_grpc_requests(http, grpc):
    def dit():
        (stats,) = http.get_inference_statistics("dit")["model_stats"]
        return stats

    before = dit()
    http.infer("dit", [http_input([1, 2])])
    grpc_result(grpc, "dit", [1, 2, 3])
    after = dit()
    assert after["inference_count"] - before["inference_count"] == 5
    assert after["execution_count"] - before["execution_count"] == 2
    succ = after["inference_stats"]["success"]
    assert succ["count"] - before["inference_stats"]["success"]["count"] == 2
    grpc_stats = grpc.get_inference_statistics("dit").model_stats[0]
    assert grpc_stats.inference_count == after["inference_count"]
    assert "model_stats" in http.get_inference_statistics()


def test_async_requests_in_parallel(server):
    client = httpclient.InferenceServerClient(server.http, concurrency=8)
    try:
        pending = [client.async_infer("sd15", [http_input([i])],
                                      request_id=str(i)) for i in range(32)]
        results = [p.get_result(timeout=60) for p in pending]
    finally:
        client.close()
    for i, result in enumerate(results):
        assert result.get_response()["id"] == str(i)
        assert result.as_numpy("EMBEDDING").shape == (1, 320)


def test_tokens_through_headers(start_server, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-1\n")
    srv = start_server(f"--auth_token_file={tokens}")
    client = httpclient.InferenceServerClient(srv.http)
    try:
        with pytest.raises(InferenceServerException) as error:
            client.infer("sd15", [http_input([1])])
        assert error.value.status() == "401"
        result = client.infer("sd15", [http_input([1])],
                              headers={"Authorization": "Bearer tok-1"})
        assert result.as_numpy("EMBEDDING").shape == (1, 320)
    finally:
        client.close()
