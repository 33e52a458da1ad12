"""temb-server through the KServe v2 / Triton gRPC protocol, with Triton's own
Python client: metadata, inference against a float64 reference and against
the native API byte for byte, streaming, and the error codes."""

import queue
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from conftest import require_env, start_server
import temb_reference as reference
from temb_testing import generate_stubs

TIMESTEPS = np.array([0.0, 1.0, 2.5, 49.0, 500.0, 999.0, -3.25, 1e4],
                     dtype=np.float32)
FLUX_TIMESTEPS = np.array([0.0, 0.001, 0.25, 0.5, 0.999, 1.0],
                          dtype=np.float32)


def make_input(values, datatype=None, shape=None):
    values = np.asarray(values)
    if shape is None:
        shape = [len(values), 1]
    datatype = datatype or np_to_triton_dtype(values.dtype)
    tensor = triton.InferInput("TIMESTEP", shape, datatype)
    tensor.set_data_from_numpy(values.reshape(shape))
    return tensor


def infer(client, model, values, **kwargs):
    return client.infer(model, [make_input(values)], **kwargs)


def raw_output(result):
    response = result.get_response()
    assert len(response.outputs) == 1
    assert response.outputs[0].name == "EMBEDDING"
    return response.outputs[0], response.raw_output_contents[0]


def native_embed(native, preset, timesteps, dtype="DTYPE_UNSPECIFIED",
                 dim=None):
    temb_pb2, stub = native
    request = temb_pb2.EmbedRequest(preset=preset,
                                    timesteps=[float(t) for t in timesteps],
                                    dtype=temb_pb2.DType.Value(dtype))
    if dim is not None:
        request.spec.dim = dim
    return stub.Embed(request, timeout=10).embedding


def expect_error(code, fn, *args, contains=None, **kwargs):
    with pytest.raises(InferenceServerException) as info:
        fn(*args, **kwargs)
    assert info.value.status() == str(code), info.value
    if contains:
        assert contains in info.value.message(), info.value
    return info.value


def expect_rpc_error(code, rpc, request, contains=None):
    with pytest.raises(grpc.RpcError) as info:
        rpc(request, timeout=10)
    assert info.value.code() == code, info.value
    if contains:
        assert contains in info.value.details(), info.value.details()


def timestep_request(model="sd15", values=(1.0, 2.0), datatype="FP32",
                     shape=None):
    request = service_pb2.ModelInferRequest(model_name=model, id="raw")
    tensor = request.inputs.add(name="TIMESTEP", datatype=datatype)
    tensor.shape.extend(shape if shape is not None else [len(values), 1])
    return request


# ---------------------------------------------------------------- metadata


def test_server_live_and_ready(client):
    assert client.is_server_live()
    assert client.is_server_ready()


def test_every_preset_model_is_ready(client):
    for model in reference.PRESETS:
        assert client.is_model_ready(model), model
        assert client.is_model_ready(model, "1"), model
    assert not client.is_model_ready("no-such-model")
    assert not client.is_model_ready("sd15", "2")


def test_server_metadata(client):
    metadata = client.get_server_metadata()
    assert metadata.name == "temb"
    assert metadata.version and metadata.version[0].isdigit()
    # Statistics are implemented: perf_analyzer polls them for its
    # server-side breakdown.
    assert "statistics" in metadata.extensions
    assert "model_configuration" in metadata.extensions


def test_model_metadata_fixed_dim(client):
    metadata = client.get_model_metadata("sd15")
    assert metadata.name == "sd15"
    assert list(metadata.versions) == ["1"]
    assert metadata.platform == "temb"
    (inp,), (out,) = metadata.inputs, metadata.outputs
    assert (inp.name, inp.datatype, list(inp.shape)) == ("TIMESTEP", "FP32",
                                                         [-1, 1])
    assert (out.name, out.datatype, list(out.shape)) == ("EMBEDDING", "FP32",
                                                         [-1, 320])
    assert list(client.get_model_metadata("ddpm").outputs[0].shape) == [-1,
                                                                         128]


def test_model_metadata_caller_chosen_dim(client):
    for model in ("transformer", "ldm", "diffusers-default"):
        out = client.get_model_metadata(model).outputs[0]
        assert list(out.shape) == [-1, -1], model


def test_model_config(client):
    config = client.get_model_config("flux").config
    assert config.name == "flux"
    assert config.platform == "temb"
    assert config.backend == "temb"
    assert config.max_batch_size > 0
    (inp,), (out,) = config.input, config.output
    assert inp.name == "TIMESTEP"
    assert inp.data_type == model_config_pb2.DataType.Value("TYPE_FP32")
    assert list(inp.dims) == [1]
    assert out.name == "EMBEDDING"
    assert out.data_type == model_config_pb2.DataType.Value("TYPE_FP32")
    assert list(out.dims) == [256]
    assert list(
        client.get_model_config("transformer").config.output[0].dims) == [-1]


def test_unknown_model_and_version_are_not_found(client):
    expect_error("StatusCode.NOT_FOUND", client.get_model_metadata, "nope")
    expect_error("StatusCode.NOT_FOUND", client.get_model_config, "nope")
    expect_error("StatusCode.NOT_FOUND", client.get_model_metadata, "sd15",
                 "2")
    expect_error("StatusCode.NOT_FOUND", infer, client, "nope", TIMESTEPS)
    expect_error("StatusCode.NOT_FOUND", infer, client, "sd15", TIMESTEPS,
                 model_version="7")


def test_statistics_count_the_inferences(client):
    before = client.get_inference_statistics("sd3").model_stats[0]
    infer(client, "sd3", TIMESTEPS)
    after = client.get_inference_statistics("sd3").model_stats[0]
    assert after.name == "sd3" and after.version == "1"
    assert (after.inference_stats.success.count
            == before.inference_stats.success.count + 1)
    assert after.inference_count == before.inference_count + len(TIMESTEPS)
    assert after.inference_stats.compute_infer.ns > \
        before.inference_stats.compute_infer.ns


# -------------------------------------------------------------- inference


def test_reference_matches_published_golden_row():
    # docs/semantics.md section 8: LDM, D=8, t=999.
    golden = [0.999649853, 0.807458658, -0.844469696, 0.541143507,
              -0.0264607527, -0.589924161, -0.535603335, 0.840930262]
    np.testing.assert_allclose(
        reference.preset_embedding("ldm", [999.0], dim=8)[0], golden,
        atol=1e-8)


@pytest.mark.parametrize("model,values", [
    ("sd15", TIMESTEPS),
    ("ddpm", TIMESTEPS),
    ("dit-diffusers", TIMESTEPS),
    ("flux", FLUX_TIMESTEPS),
])
def test_fp32_matches_float64_reference(client, model, values):
    result = infer(client, model, values, request_id="req-42")
    assert result.get_response().id == "req-42"
    assert result.get_response().model_name == model
    assert result.get_response().model_version == "1"
    out = result.as_numpy("EMBEDDING")
    expected = reference.preset_embedding(model, values)
    assert out.dtype == np.float32
    assert out.shape == expected.shape
    error = np.abs(out.astype(np.float64) - expected)
    assert np.all(error <= reference.preset_fp32_bound(model, values)), \
        error.max()


def test_int64_fp64_int32_inputs_equal_fp32_input(client):
    expected = infer(client, "sd15", TIMESTEPS[:6]).as_numpy("EMBEDDING")
    integral = np.array([0, 1, 49, 500, 999, 123456], dtype=np.int64)
    as_float = infer(client, "sd15",
                     integral.astype(np.float32)).as_numpy("EMBEDDING")
    for dtype in (np.int64, np.int32):
        out = infer(client, "sd15", integral.astype(dtype))
        np.testing.assert_array_equal(out.as_numpy("EMBEDDING"), as_float)
    out = infer(client, "sd15", TIMESTEPS[:6].astype(np.float64))
    np.testing.assert_array_equal(out.as_numpy("EMBEDDING"), expected)


def test_shape_without_the_trailing_one(client):
    flat = client.infer("ddpm", [make_input(TIMESTEPS, shape=[len(TIMESTEPS)])])
    column = infer(client, "ddpm", TIMESTEPS)
    assert raw_output(flat)[1] == raw_output(column)[1]
    assert list(raw_output(flat)[0].shape) == [len(TIMESTEPS), 128]


@pytest.mark.parametrize("how", ["dtype", "datatype"])
def test_fp16_and_bf16_are_rne_of_fp32(client, how):
    fp32 = infer(client, "sd15", TIMESTEPS).as_numpy("EMBEDDING")
    for name, expected in (
            ("FP16", fp32.astype(np.float16).view(np.uint16)),
            ("BF16", reference.to_bf16_bits(fp32))):
        if how == "dtype":
            result = infer(client, "sd15", TIMESTEPS,
                           parameters={"dtype": name})
        else:
            output = triton.InferRequestedOutput("EMBEDDING")
            output._output.parameters["datatype"].string_param = name.lower()
            result = infer(client, "sd15", TIMESTEPS, outputs=[output])
        tensor, data = raw_output(result)
        assert tensor.datatype == name
        assert list(tensor.shape) == [len(TIMESTEPS), 320]
        got = np.frombuffer(data, dtype="<u2").reshape(expected.shape)
        np.testing.assert_array_equal(got, expected)


def test_fp64_output_and_precision_parameter(client):
    result = infer(client, "sd15", TIMESTEPS,
                   parameters={"dtype": "FP64", "precision": "fp64"})
    tensor, data = raw_output(result)
    assert tensor.datatype == "FP64"
    out = np.frombuffer(data, dtype="<f8").reshape(len(TIMESTEPS), 320)
    # Angles in double: far closer to the float64 ideal than any fp32 path.
    np.testing.assert_allclose(out, reference.preset_embedding("sd15", TIMESTEPS),
                               rtol=0, atol=1e-10)
    fp32 = infer(client, "sd15", TIMESTEPS,
                 parameters={"precision": "FP64"}).as_numpy("EMBEDDING")
    np.testing.assert_array_equal(fp32, out.astype(np.float32))


def test_dim_parameter(client):
    for model, dim in (("transformer", 64), ("ldm", 8), ("ldm", 7)):
        result = infer(client, model, TIMESTEPS[:6], parameters={"dim": dim})
        tensor, _ = raw_output(result)
        assert list(tensor.shape) == [6, dim]
        out = result.as_numpy("EMBEDDING").astype(np.float64)
        expected = reference.preset_embedding(model, TIMESTEPS[:6], dim=dim)
        assert np.all(np.abs(out - expected) <= reference.preset_fp32_bound(
            model, TIMESTEPS[:6]))


@pytest.mark.parametrize("model,values,dtype,dim", [
    ("sd15", TIMESTEPS, "FP32", None),
    ("ddpm", TIMESTEPS, "BF16", None),
    ("flux", FLUX_TIMESTEPS, "FP16", None),
    ("transformer", TIMESTEPS, "FP32", 96),
])
def test_same_bytes_as_native_api(client, native, model, values, dtype, dim):
    parameters = {"dtype": dtype}
    if dim:
        parameters["dim"] = dim
    _, kserve_bytes = raw_output(
        infer(client, model, values, parameters=parameters))
    native_tensor = native_embed(native, model, values, "DTYPE_" + dtype, dim)
    assert native_tensor.data == kserve_bytes
    assert len(kserve_bytes) > 0


def test_typed_contents(kserve_stub):
    raw_answer = None
    for datatype, field, values in (
            ("FP32", "fp32_contents", [0.0, 1.5, 999.0]),
            ("INT64", "int64_contents", [0, 1, 999]),
            ("FP64", "fp64_contents", [0.0, 1.5, 999.0]),
            ("INT32", "int_contents", [0, 1, 999])):
        request = timestep_request("dit", values, datatype)
        getattr(request.inputs[0].contents, field).extend(values)
        response = kserve_stub.ModelInfer(request, timeout=10)
        assert response.id == "raw"
        assert list(response.outputs[0].shape) == [3, 256]
        raw = timestep_request("dit", values, datatype)
        raw.raw_input_contents.append(
            np.asarray(values, dtype=np.dtype(field_dtype(datatype))).tobytes())
        raw_answer = kserve_stub.ModelInfer(raw, timeout=10)
        assert response.raw_output_contents == raw_answer.raw_output_contents


def field_dtype(datatype):
    return {"FP32": "<f4", "INT64": "<i8", "FP64": "<f8", "INT32": "<i4"}[
        datatype]


def test_empty_batch(kserve_stub):
    request = timestep_request("sd15", [], shape=[0, 1])
    request.raw_input_contents.append(b"")
    response = kserve_stub.ModelInfer(request, timeout=10)
    assert list(response.outputs[0].shape) == [0, 320]
    assert response.raw_output_contents[0] == b""


# ------------------------------------------------------------------ errors

INVALID = "StatusCode.INVALID_ARGUMENT"


def test_wrong_input_name(client):
    tensor = triton.InferInput("T", [2, 1], "FP32")
    tensor.set_data_from_numpy(np.zeros((2, 1), np.float32))
    expect_error(INVALID, client.infer, "sd15", [tensor],
                 contains="inputs[0].name")


def test_wrong_input_datatype(client):
    expect_error(INVALID, infer, client, "sd15",
                 TIMESTEPS.astype(np.float16), contains="inputs[0].datatype")


def test_bad_shape(client):
    # Shapes of rank 1 to 5 are timesteps tensors; rank 6 is refused.
    shape = [1, 1, 1, 1, 1, 1]
    tensor = triton.InferInput("TIMESTEP", shape, "FP32")
    tensor.set_data_from_numpy(np.zeros(shape, np.float32))
    expect_error(INVALID, client.infer, "sd15", [tensor],
                 contains="inputs[0].shape")


def test_shaped_timesteps_give_shape_plus_dim(client, native):
    # Per-token timesteps [B, L] (Wan 2.2 TI2V, LTX) give [B, L, dim].
    values = np.arange(14, dtype=np.float32).reshape(2, 7) * 70.5
    tensor = triton.InferInput("TIMESTEP", [2, 7], "FP32")
    tensor.set_data_from_numpy(values)
    result = client.infer("wan-diffusers", [tensor])
    output, raw = raw_output(result)
    assert list(output.shape) == [2, 7, 256]
    flat = native_embed(native, "wan-diffusers", values.reshape(-1))
    assert raw == flat.data


def test_flux_timestep_and_guidance_in_one_call(client, native):
    timestep = triton.InferInput("TIMESTEP", [2], "FP32")
    timestep.set_data_from_numpy(np.array([0.25, 1.0], np.float32))
    guidance = triton.InferInput("GUIDANCE", [2], "FP32")
    guidance.set_data_from_numpy(np.array([3.5, 3.5], np.float32))
    result = client.infer("flux", [timestep, guidance])
    response = result.get_response()
    names = [output.name for output in response.outputs]
    assert names == ["EMBEDDING", "GUIDANCE_EMBEDDING"]
    assert response.raw_output_contents[0] == native_embed(
        native, "flux", [0.25, 1.0]).data
    assert response.raw_output_contents[1] == native_embed(
        native, "flux", [3.5, 3.5]).data
    expect_error(INVALID, client.infer, "sd15", [timestep, guidance],
                 contains="unknown input \"GUIDANCE\"")


def test_unknown_requested_output(client):
    expect_error(INVALID, infer, client, "sd15", TIMESTEPS,
                 outputs=[triton.InferRequestedOutput("OUT")],
                 contains="outputs[0].name")


def test_bad_parameters(client):
    expect_error(INVALID, infer, client, "sd15", TIMESTEPS,
                 parameters={"dtype": "int8"}, contains='"dtype"')
    expect_error(INVALID, infer, client, "sd15", TIMESTEPS,
                 parameters={"precision": "fp16"}, contains='"precision"')
    expect_error(INVALID, infer, client, "sd15", TIMESTEPS,
                 parameters={"dtpye": "FP16"}, contains='"dtpye"')
    # sd15's width is fixed by the model.
    expect_error(INVALID, infer, client, "sd15", TIMESTEPS,
                 parameters={"dim": 64}, contains="dim")
    expect_error(INVALID, infer, client, "transformer", TIMESTEPS,
                 parameters={"dim": 0}, contains="dim")


def test_non_finite_timestep(client):
    values = np.array([1.0, np.nan, 3.0], dtype=np.float32)
    expect_error(INVALID, infer, client, "sd15", values,
                 contains="timesteps[1]")
    values = np.array([1.0, 2.0, np.inf], dtype=np.float32)
    expect_error(INVALID, infer, client, "sd15", values,
                 contains="timesteps[2]")


def test_limits_are_resource_exhausted(client):
    expect_error("StatusCode.RESOURCE_EXHAUSTED", infer, client,
                 "transformer", TIMESTEPS, parameters={"dim": 1 << 20})
    # One more row than the batch limit the model configuration announces.
    max_batch = client.get_model_config("sd15").config.max_batch_size
    big = np.zeros(max_batch + 1, dtype=np.float32)
    expect_error("StatusCode.RESOURCE_EXHAUSTED", infer, client, "sd15", big,
                 contains="batch")


def test_raw_byte_size_mismatch(kserve_stub):
    request = timestep_request("sd15", [1.0, 2.0, 3.0])
    request.raw_input_contents.append(
        np.array([1, 2], dtype=np.float32).tobytes())
    expect_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, kserve_stub.ModelInfer,
                     request, contains="raw_input_contents[0]")
    request.raw_input_contents[0] = b"\0" * 13
    expect_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, kserve_stub.ModelInfer,
                     request, contains="raw_input_contents[0]")


def test_raw_and_typed_contents_at_once(kserve_stub):
    request = timestep_request("sd15", [1.0, 2.0])
    request.inputs[0].contents.fp32_contents.extend([1.0, 2.0])
    request.raw_input_contents.append(
        np.array([1, 2], dtype=np.float32).tobytes())
    expect_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, kserve_stub.ModelInfer,
                     request, contains="inputs[0].contents")


def test_typed_contents_mismatches(kserve_stub):
    request = timestep_request("sd15", [1.0, 2.0], "FP32")
    request.inputs[0].contents.int64_contents.extend([1, 2])
    expect_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, kserve_stub.ModelInfer,
                     request, contains="fp32_contents")
    request = timestep_request("sd15", [1.0, 2.0], "FP32")
    request.inputs[0].contents.fp32_contents.extend([1.0, 2.0, 3.0])
    expect_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, kserve_stub.ModelInfer,
                     request, contains="inputs[0].contents.fp32_contents")


def test_missing_and_extra_inputs(kserve_stub):
    request = service_pb2.ModelInferRequest(model_name="sd15")
    expect_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, kserve_stub.ModelInfer,
                     request, contains="inputs")
    request = timestep_request("sd15", [1.0])
    request.inputs[0].contents.fp32_contents.append(1.0)
    request.inputs.add().CopyFrom(request.inputs[0])
    expect_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, kserve_stub.ModelInfer,
                     request, contains="inputs")


# --------------------------------------------------------------- streaming


def test_stream_infer(client):
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(
        (result, error)))
    try:
        client.async_stream_infer("sd15", [make_input(TIMESTEPS)],
                                  request_id="a")
        client.async_stream_infer("flux", [make_input(np.float32([np.nan]))],
                                  request_id="bad")
        client.async_stream_infer("nope", [make_input(TIMESTEPS)],
                                  request_id="gone")
        client.async_stream_infer("ddpm", [make_input(TIMESTEPS)],
                                  request_id="b",
                                  parameters={"dtype": "BF16"})
        results = [answers.get(timeout=10) for _ in range(4)]
    finally:
        client.stop_stream()

    (first, err1), (_, err2), (_, err3), (last, err4) = results
    assert err1 is None and err4 is None
    assert first.get_response().id == "a"
    np.testing.assert_array_equal(
        first.as_numpy("EMBEDDING"),
        infer(client, "sd15", TIMESTEPS).as_numpy("EMBEDDING"))
    assert "timesteps[0]" in err2.message()
    assert "nope" in err3.message()
    assert last.get_response().id == "b"
    tensor, data = raw_output(last)
    assert tensor.datatype == "BF16"
    assert data == raw_output(
        infer(client, "ddpm", TIMESTEPS, parameters={"dtype": "BF16"}))[1]


def test_stream_answers_equal_the_unary_answers(kserve_stub, native):
    """Both streams frame each answer as their unary method does (around
    the memory it was computed in): one 2.5 MiB output and several outputs
    parse to the very message the unary call returns."""
    values = np.linspace(0, 999, 2048, dtype=np.float32).tolist()
    big = timestep_request("sd15", values)
    big.inputs[0].contents.fp32_contents.extend(values)
    big.id = "big"
    both = service_pb2.ModelInferRequest(model_name="flux", id="both")
    for name, part in (("TIMESTEP", [0.5, 0.25]), ("GUIDANCE", [3.5, 3.5])):
        tensor = both.inputs.add(name=name, datatype="FP32")
        tensor.shape.append(len(part))
        tensor.contents.fp32_contents.extend(part)
    requests = [big, both]
    answers = list(kserve_stub.ModelStreamInfer(iter(requests), timeout=30))
    assert len(answers) == 2
    for request, answer in zip(requests, answers):
        assert answer.error_message == ""
        assert answer.infer_response == kserve_stub.ModelInfer(request,
                                                               timeout=30)
    assert len(answers[0].infer_response.raw_output_contents[0]) == 2048 * 320 * 4

    pb, stub = native
    big = pb.EmbedRequest(preset="sd15", timesteps=values, request_id="big")
    both = pb.EmbedRequest(preset="flux", request_id="both")
    both.parts.add(name="timestep", timesteps=[0.5, 0.25])
    both.parts.add(name="guidance", timesteps=[3.5, 3.5])
    requests = [big, both]
    answers = list(stub.EmbedStream(iter(requests), timeout=30))
    assert len(answers) == 2
    for request, answer in zip(requests, answers):
        assert answer.request_id == request.request_id
        assert answer.response == stub.Embed(request, timeout=30)
    assert len(answers[0].response.embedding.data) == 2048 * 320 * 4
    assert [p.name for p in answers[1].response.parts] == ["timestep",
                                                           "guidance"]


def test_stream_error_echoes_id(kserve_stub):
    bad = timestep_request("sd15", [1.0], datatype="BYTES")
    bad.id = "bad-1"
    good = timestep_request("sd15", [1.0])
    good.inputs[0].contents.fp32_contents.append(1.0)
    good.id = "good-2"
    responses = list(kserve_stub.ModelStreamInfer(iter([bad, good]),
                                                  timeout=10))
    assert len(responses) == 2
    assert "inputs[0].datatype" in responses[0].error_message
    assert responses[0].infer_response.id == "bad-1"
    assert responses[1].error_message == ""
    assert responses[1].infer_response.id == "good-2"
    assert list(responses[1].infer_response.outputs[0].shape) == [1, 320]


# ------------------------------------------------------- health and drain


def test_health_reports_the_kserve_service(tmp_path_factory, channel):
    generate_stubs(tmp_path_factory.mktemp("health_stubs"),
                   "grpc/health/v1/health.proto", prefix="kserve_health",
                   proto_dir=require_env("TEMB_PROTO_DIR"))
    # pylint: disable=import-outside-toplevel
    from kserve_health.grpc.health.v1 import health_pb2, health_pb2_grpc
    stub = health_pb2_grpc.HealthStub(channel)
    answer = stub.Check(health_pb2.HealthCheckRequest(
        service="inference.GRPCInferenceService"), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_draining_server_refuses_new_calls(tmp_path):
    """After SIGTERM readiness turns false and new calls are refused with
    UNAVAILABLE; an open stream's next request ends it with UNAVAILABLE, so
    that its client reconnects to a serving replica."""
    srv = start_server(tmp_path, "--drain_grace=60s")
    requests = queue.Queue()
    try:
        with grpc.insecure_channel(srv.target) as ch:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            responses = stub.ModelStreamInfer(iter(requests.get, None),
                                              timeout=60)
            request = timestep_request("sd15", [1.0])
            request.inputs[0].contents.fp32_contents.append(1.0)
            requests.put(request)
            assert next(responses).error_message == ""

            srv.process.terminate()
            with triton.InferenceServerClient(srv.target) as fresh:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if not fresh.is_server_ready():
                            break
                    except InferenceServerException as error:
                        assert error.status() == "StatusCode.UNAVAILABLE"
                        break
                    assert time.monotonic() < deadline, "never drained"
                    time.sleep(0.05)
                expect_error("StatusCode.UNAVAILABLE", infer, fresh, "sd15",
                             TIMESTEPS)

            requests.put(request)  # the open stream is told to go elsewhere
            with pytest.raises(grpc.RpcError) as error:
                next(responses)
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE
            requests.put(None)
        assert srv.process.wait(timeout=30) == 0
    finally:
        requests.put(None)
        srv.stop()
