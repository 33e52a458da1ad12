"""Errors, concurrency, streaming, asyncio and health against a real server."""

import asyncio
import concurrent.futures
import json
import math
import socket

import grpc
import numpy as np
import pytest

import temb

LDM = dict(flip_sin_to_cos=True, downscale_freq_shift=0.0)


# --- errors ----------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    (dict(dim=0, **LDM), "dim"),
    (dict(dim=8, flip_sin_to_cos=True), "downscale_freq_shift"),
    (dict(dim=8, downscale_freq_shift=0.0), "flip_sin_to_cos"),
    (dict(flip_sin_to_cos=True, downscale_freq_shift=0.0), "dim"),
    (dict(dim=3, flip_sin_to_cos=False, downscale_freq_shift=1.0), "downscale_freq_shift"),
    (dict(dim=7, layout="interleaved", **LDM), "interleaved"),
    (dict(dim=8, max_period=-1.0, **LDM), "max_period"),
    (dict(dim=8, scale=math.inf, **LDM), "scale"),
    (dict(preset="sdxl", max_period=100.0), "max_period"),
    (dict(preset="sdxl", flip_sin_to_cos=False), "flip_sin_to_cos"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_invalid_argument(client, kwargs, field):
    with pytest.raises(temb.InvalidArgumentError) as e:
        client.embed([1.0], **kwargs)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in e.value.details


def test_non_finite_timestep_names_the_index(client):
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(temb.InvalidArgumentError) as e:
            client.embed([0.0, 1.0, bad], dim=8, **LDM)
        assert "timesteps[2]" in e.value.details
    with pytest.raises(temb.InvalidArgumentError):
        client.embed([1e39], dim=8, **LDM)  # inf once rounded to float32


def test_unknown_preset_is_not_found(client):
    with pytest.raises(temb.NotFoundError) as e:
        client.embed([1.0], preset="no-such-model", request_id="r-17")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert "no-such-model" in e.value.details
    assert e.value.request_id == "r-17"
    assert isinstance(e.value, temb.TembError)


def test_limits_are_resource_exhausted(client, info):
    with pytest.raises(temb.ResourceExhaustedError) as e:
        client.embed([1.0], dim=info.limits.max_dim + 1, **LDM)
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "dim" in e.value.details
    batch = info.limits.max_batch + 1
    if batch * 4 > info.limits.max_message_bytes:
        pytest.skip("max_batch is beyond the message limit")
    with pytest.raises(temb.ResourceExhaustedError):
        client.embed(np.zeros(batch, np.float32), dim=2, **LDM)


def test_unreachable_server_is_unavailable():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with temb.Client(f"127.0.0.1:{port}", retries=0, timeout=20) as c:
        with pytest.raises(temb.UnavailableError) as e:
            c.embed([1.0], dim=8, **LDM)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_retries_on_unavailable_still_fail_cleanly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with temb.Client(f"127.0.0.1:{port}", retries=2, timeout=20) as c:
        with pytest.raises(temb.UnavailableError):
            c.server_info()


@pytest.mark.parametrize("retries, attempts", [(0, None), (1, 2), (3, 4), (9, 5)])
def test_retry_policy_in_service_config(retries, attempts):
    from temb import _channel
    config = json.loads(_channel.service_config(retries))["methodConfig"][0]
    assert {"service": "temb.v1.EmbeddingService"} in config["name"]
    if attempts is None:
        assert "retryPolicy" not in config
    else:
        policy = config["retryPolicy"]
        assert policy["maxAttempts"] == attempts  # gRPC caps it at 5
        assert policy["retryableStatusCodes"] == ["UNAVAILABLE"]


def test_expired_deadline_is_deadline_exceeded(client):
    # gRPC rounds a deadline up to whole milliseconds: the call must need
    # more than that (16M elements), or a quick one could finish in time.
    with pytest.raises(temb.DeadlineExceededError) as e:
        client.embed(np.zeros(4096, np.float32), dim=4096, timeout=1e-6,
                     **LDM)
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


# --- concurrency -----------------------------------------------------------

def test_many_threads_share_one_client(client):
    jobs = [(np.arange(n, dtype=np.float32) * 7.5, 32 + 8 * (n % 5))
            for n in range(1, 41)]
    expected = [client.embed(t, dim=d, **LDM) for t, d in jobs]

    def run(index):
        t, d = jobs[index % len(jobs)]
        return index, client.embed(t, dim=d, request_id=str(index), **LDM)

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        for index, got in pool.map(run, range(200)):
            np.testing.assert_array_equal(got, expected[index % len(jobs)])


# --- streaming -------------------------------------------------------------

def test_stream_answers_in_order(client):
    requests = [dict(timesteps=[float(i)] * (i + 1), dim=8 + 2 * i,
                     request_id=f"s{i}", **LDM) for i in range(20)]
    results = list(client.embed_stream(requests))
    assert len(results) == 20
    for request, result in zip(requests, results):
        np.testing.assert_array_equal(
            result, client.embed(request["timesteps"], dim=request["dim"], **LDM))


def test_stream_yields_errors_in_place(client):
    requests = [
        dict(timesteps=[1.0], dim=8, **LDM),
        dict(timesteps=[1.0], preset="no-such-model", request_id="bad"),
        dict(timesteps=[1.0], dim=0, **LDM),
        dict(timesteps=[2.0], preset="sdxl", dtype="fp16"),
    ]
    results = list(client.embed_stream(iter(requests), raise_errors=False))
    assert results[0].shape == (1, 8)
    assert isinstance(results[1], temb.NotFoundError)
    assert results[1].request_id == "bad"
    assert isinstance(results[2], temb.InvalidArgumentError)
    assert results[3].dtype == np.float16 and results[3].shape == (1, 320)


def test_stream_raises_the_first_error(client):
    requests = [dict(timesteps=[1.0], dim=8, **LDM),
                dict(timesteps=[1.0], preset="no-such-model"),
                dict(timesteps=[1.0], dim=8, **LDM)]
    stream = client.embed_stream(requests)
    assert next(stream).shape == (1, 8)
    with pytest.raises(temb.NotFoundError):
        next(stream)


def test_stream_item_that_cannot_be_encoded(client):
    def requests():
        yield dict(timesteps=[1.0], dim=8, **LDM)
        yield dict(timesteps=np.zeros((1,) * 6), dim=8, **LDM)
    stream = client.embed_stream(requests())
    assert next(stream).shape == (1, 8)
    with pytest.raises(ValueError, match="at most 5 dimensions"):
        next(stream)


def test_stream_decoding_options_per_item(client):
    results = list(client.embed_stream([
        dict(timesteps=[1.0], dim=8, dtype="bf16", bf16_format="bits", **LDM),
        dict(timesteps=[1.0], dim=8, dtype="fp64", **LDM)]))
    assert results[0].dtype == np.uint16
    assert results[1].dtype == np.float64


# --- asyncio ---------------------------------------------------------------

def test_asyncio_client(server, client):
    want = client.embed([1.0, 2.0], dim=16, **LDM)

    async def main():
        async with temb.aio.Client(server.target, timeout=60) as aclient:
            results = await asyncio.gather(*[
                aclient.embed([1.0, 2.0], dim=16, **LDM) for _ in range(16)])
            for got in results:
                np.testing.assert_array_equal(got, want)
            with pytest.raises(temb.NotFoundError):
                await aclient.embed([1.0], preset="no-such-model")
            info = await aclient.server_info()
            assert info.version == temb.__version__
            assert await aclient.health() == temb.HealthStatus.SERVING

            async def requests():
                for i in range(5):
                    yield dict(timesteps=[1.0, 2.0], dim=16, **LDM)
                yield dict(timesteps=[1.0], dim=0, **LDM)
            streamed = [r async for r in aclient.embed_stream(
                requests(), raise_errors=False)]
            assert len(streamed) == 6
            for got in streamed[:5]:
                np.testing.assert_array_equal(got, want)
            assert isinstance(streamed[5], temb.InvalidArgumentError)
            plain = [r async for r in aclient.embed_stream(
                [dict(timesteps=[1.0, 2.0], dim=16, **LDM)])]
            np.testing.assert_array_equal(plain[0], want)

    asyncio.run(main())


# --- health and metadata ---------------------------------------------------

def test_health(client):
    assert client.health() == temb.HealthStatus.SERVING
    with pytest.raises(temb.NotFoundError):
        client.health("no.such.Service")


def test_health_messages_are_encoded_as_the_proto_says(tmp_path):
    """The client writes and reads grpc.health.v1 by hand (temb._codec):
    its field numbers and bytes are those of the .proto's descriptors, read
    into a pool of their own (the default pool is left alone)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from grpc_tools import protoc
    from temb import _codec
    from temb_testing import REPO
    descriptors = tmp_path / "health.desc"
    assert protoc.main(["protoc", f"-I{REPO / 'proto'}",
                        f"--descriptor_set_out={descriptors}",
                        "grpc/health/v1/health.proto"]) == 0
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(
            descriptors.read_bytes()).file:
        pool.Add(file)
    request = pool.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest")
    response = pool.FindMessageTypeByName("grpc.health.v1.HealthCheckResponse")
    assert request.fields_by_name["service"].number == _codec.HEALTH_SERVICE_FIELD
    assert response.fields_by_name["status"].number == _codec.HEALTH_STATUS_FIELD
    request_class = message_factory.GetMessageClass(request)
    response_class = message_factory.GetMessageClass(response)
    for service in ("", "temb.v1.EmbeddingService", "\u00e9" * 100):
        assert (_codec.encode_health_request(service)
                == request_class(service=service).SerializeToString())
    for status in response.fields_by_name["status"].enum_type.values_by_number:
        data = response_class(status=status).SerializeToString()
        assert _codec.decode_health_response(data) == status


def test_settings_open_an_equal_client(server):
    with temb.Client(server.target, timeout=7, retries=0,
                     auth_token="secret") as c:
        settings = c.settings
        assert settings["target"] == server.target
        assert (settings["timeout"], settings["retries"]) == (7, 0)
        settings["timeout"] = 1  # a copy
        with temb.Client(**c.settings) as again:
            assert again.settings == c.settings
            assert again.embed([1.0], dim=4, **LDM).shape == (1, 4)


def test_auth_token_is_sent_as_metadata(server):
    # The test server has no auth configured: a token is accepted and ignored.
    with temb.Client(server.target, auth_token="secret") as c:
        assert c.embed([1.0], dim=4, **LDM).shape == (1, 4)


def test_tls_config_is_validated():
    with pytest.raises(ValueError, match="private_key"):
        temb.Client("127.0.0.1:1", tls=temb.TlsConfig(certificate_chain=b"x"))
    with pytest.raises(TypeError):
        temb.Client("127.0.0.1:1", tls="yes")
