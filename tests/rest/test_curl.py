"""Every REST endpoint with curl, the tool operators reach for: status codes,
headers and JSON bodies, the binary tensor data extension, and each error
path (400, 401, 404, 405, 413, 429, 503), TLS and mutual TLS."""
import json
import struct
import subprocess
import time

import numpy as np
import pytest

from conftest import CURL_TIMEOUT


def curl(url, *args, method=None, data=None, headers=(), tls=()):
    """(status, {lower-case header: value}, body bytes); status 0 when no
    HTTP answer came (connection refused, TLS failure)."""
    command = ["curl", "-sS", "-i", "--max-time", "20", *tls]
    if method:
        command += ["-X", method]
    for header in headers:
        command += ["-H", header]
    if data is not None:
        command += ["--data-binary", "@-"]
    command += [*args, url]
    run = subprocess.run(command, input=data, capture_output=True,
                         timeout=CURL_TIMEOUT, check=False)
    if run.returncode != 0 or not run.stdout:
        return 0, {}, run.stderr
    head, _, body = run.stdout.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return status, fields, body


def infer_body(timesteps, datatype="FP32", **extra):
    return json.dumps({"inputs": [{
        "name": "TIMESTEP", "shape": [len(timesteps), 1],
        "datatype": datatype, "data": timesteps}], **extra}).encode()


def error_of(body):
    parsed = json.loads(body)
    assert set(parsed) == {"error"}, parsed
    return parsed["error"]


def test_health(server):
    for path in ("/v2/health/live", "/v2/health/ready"):
        status, headers, body = curl(server.url + path)
        assert status == 200 and body == b"", (path, body)
        assert headers["content-length"] == "0"


def test_server_and_model_metadata(server):
    status, headers, body = curl(server.url + "/v2")
    assert status == 200 and headers["content-type"] == "application/json"
    meta = json.loads(body)
    assert meta["name"] == "temb"
    assert {"statistics", "binary_tensor_data",
            "model_configuration"} <= set(meta["extensions"])

    for path in ("/v2/models/sdxl", "/v2/models/sdxl/versions/1"):
        status, _, body = curl(server.url + path)
        assert status == 200, body
        model = json.loads(body)
        assert model["name"] == "sdxl" and model["versions"] == ["1"]
        assert model["inputs"] == [
            {"name": "TIMESTEP", "datatype": "FP32", "shape": [-1, 1]}]
        assert model["outputs"][0]["shape"] == [-1, 320]

    for path in ("/v2/models/sdxl/ready", "/v2/models/sdxl/versions/1/ready"):
        status, _, _ = curl(server.url + path)
        assert status == 200, path

    status, _, body = curl(server.url + "/v2/models/sdxl/config")
    assert status == 200
    config = json.loads(body)
    assert config["max_batch_size"] > 0
    assert config["input"][0]["dims"] == [1]
    assert config["output"][0] == {"name": "EMBEDDING",
                                   "data_type": "TYPE_FP32", "dims": [320]}


def test_infer_json(server):
    status, headers, body = curl(
        server.url + "/v2/models/sd15/infer", method="POST",
        data=infer_body([999, 0], id="curl-1"))
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    answer = json.loads(body)
    assert answer["id"] == "curl-1" and answer["model_version"] == "1"
    (output,) = answer["outputs"]
    assert output["name"] == "EMBEDDING" and output["shape"] == [2, 320]
    emb = np.array(output["data"], dtype=np.float32).reshape(2, 320)
    # t = 0: cos-first layout gives [1..1, 0..0].
    assert np.array_equal(emb[1], np.r_[np.ones(160), np.zeros(160)])
    assert np.all(np.abs(emb) <= 1)


def test_infer_binary_both_ways(server):
    timesteps = np.array([999, 500, 1], dtype=np.int64)
    header = json.dumps({
        "inputs": [{"name": "TIMESTEP", "shape": [3], "datatype": "INT64",
                    "parameters": {"binary_data_size": timesteps.nbytes}}],
        "outputs": [{"name": "EMBEDDING",
                     "parameters": {"binary_data": True}}]}).encode()
    status, headers, body = curl(
        server.url + "/v2/models/sd15/infer", method="POST",
        data=header + timesteps.tobytes(),
        headers=[f"Inference-Header-Content-Length: {len(header)}",
                 "Content-Type: application/octet-stream"])
    assert status == 200, body
    json_size = int(headers["inference-header-content-length"])
    head = json.loads(body[:json_size])
    (output,) = head["outputs"]
    assert output["parameters"]["binary_data_size"] == 3 * 320 * 4
    binary = np.frombuffer(body[json_size:], dtype="<f4").reshape(3, 320)

    # The JSON form of the same request carries the same numbers.
    status, _, body = curl(server.url + "/v2/models/sd15/infer",
                           method="POST", data=infer_body([999, 500, 1]))
    assert status == 200
    data = json.loads(body)["outputs"][0]["data"]
    assert np.array_equal(np.array(data, dtype=np.float32).reshape(3, 320),
                          binary)


def test_statistics(server):
    def sd21_stats():
        status, _, body = curl(server.url + "/v2/models/sd21/stats")
        assert status == 200, body
        (stats,) = json.loads(body)["model_stats"]
        assert stats["name"] == "sd21" and stats["version"] == "1"
        return stats

    before = sd21_stats()
    for _ in range(2):
        assert curl(server.url + "/v2/models/sd21/infer", method="POST",
                    data=infer_body([1, 2, 3]))[0] == 200
    after = sd21_stats()
    assert after["inference_count"] - before["inference_count"] == 6
    assert after["execution_count"] - before["execution_count"] == 2
    for phase in ("success", "queue", "compute_input", "compute_infer",
                  "compute_output"):
        delta = (after["inference_stats"][phase]["count"] -
                 before["inference_stats"][phase]["count"])
        assert delta == 2, phase
        assert isinstance(after["inference_stats"][phase]["ns"], int)
    status, _, body = curl(server.url + "/v2/models/stats")
    assert status == 200
    names = {s["name"] for s in json.loads(body)["model_stats"]}
    assert {"sd15", "sd21", "flux"} <= names


@pytest.mark.parametrize("path,method,data,code,message", [
    ("/v2/models/nope", None, None, 404, "unknown model"),
    ("/v2/models/sd15/versions/7", None, None, 404, "no version"),
    ("/v2/models/nope/ready", None, None, 404, "unknown model"),
    ("/v2/models/nope/config", None, None, 404, "unknown model"),
    ("/v2/models/nope/stats", None, None, 404, "unknown model"),
    ("/v2/models/nope/infer", "POST", infer_body([1]), 404, "unknown model"),
    ("/v2/nothing/here", None, None, 404, "no endpoint"),
    ("/v2/models/sd15/infer", None, None, 405, "POST"),
    ("/v2/health/ready", "POST", b"", 405, "GET"),
    ("/v2/models/sd15/infer", "POST", b"{oops", 400, "malformed JSON"),
    ("/v2/models/sd15/infer", "POST", infer_body([1], datatype="UINT8"),
     400, "inputs[0].datatype"),
    ("/v2/models/sd15/infer", "POST",
     json.dumps({"inputs": [{"name": "TIMESTEP", "shape": [2],
                             "datatype": "FP32", "data": [1]}]}).encode(),
     400, "inputs[0].data has 1 elements"),
    ("/v2/models/sd15/infer", "POST",
     infer_body([1], parameters={"dtype": "BF16"}), 400, "binary"),
    ("/v2/models/sd15/infer", "POST",
     infer_body([1], parameters={"dtpye": "FP16"}), 400, "dtpye"),
])
def test_errors(server, path, method, data, code, message):
    status, headers, body = curl(server.url + path, method=method, data=data)
    assert status == code, body
    assert headers["content-type"] == "application/json"
    assert message in error_of(body)


def test_limits_413_400_and_overload_429(start_server):
    srv = start_server("--max_batch=4", "--max_queued_bytes=10000")
    # Over max_batch: a client error, not worth retrying.
    status, _, body = curl(srv.url + "/v2/models/sd15/infer", method="POST",
                           data=infer_body([1, 2, 3, 4, 5]))
    assert status == 400 and "must be <= 4" in error_of(body)
    # Beyond the body limit (max_batch * 32 + 64 KiB): refused unread.
    status, _, body = curl(srv.url + "/v2/models/sd15/infer", method="POST",
                           data=b" " * 200_000)
    assert status == 413 and "limit" in error_of(body)
    # The JSON answer of 4 timesteps (up to 20 KiB) does not fit
    # max_queued_bytes: 429, worth retrying later.
    status, _, body = curl(srv.url + "/v2/models/sd15/infer", method="POST",
                           data=infer_body([1, 2, 3, 4]))
    assert status == 429 and "max_queued_bytes" in error_of(body)
    # A smaller one does.
    assert curl(srv.url + "/v2/models/sd15/infer", method="POST",
                data=infer_body([1]))[0] == 200


def test_tokens_401(start_server, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("s3cret\n")
    srv = start_server(f"--auth_token_file={tokens}")
    for path, method, data in (("/v2/health/live", None, None),
                               ("/v2", None, None),
                               ("/v2/models/sd15/stats", None, None),
                               ("/v2/models/sd15/infer", "POST",
                                infer_body([1]))):
        for headers in ([], ["Authorization: Bearer wrong"]):
            status, fields, body = curl(srv.url + path, method=method,
                                        data=data, headers=headers)
            assert status == 401, (path, body)
            assert fields["www-authenticate"] == "Bearer"
            assert "s3cret" not in body.decode()
        status, _, _ = curl(srv.url + path, method=method, data=data,
                            headers=["Authorization: Bearer s3cret"])
        assert status == 200, path


def test_draining_503_then_exit_0(start_server, tmp_path):
    """SIGTERM while a big request computes: it completes whole, new calls
    get 503 "server is draining" (and readiness 503), then exit 0."""
    srv = start_server("--drain_grace=30s", "--cpu_threads=1", metrics=True)
    rows, dim = 32768, 1024  # over a second on one CPU thread (fp64 angles)
    timesteps = (np.arange(rows) % 1000).astype(np.float32)
    header = json.dumps({
        "parameters": {"dim": dim, "precision": "fp64"},
        "inputs": [{"name": "TIMESTEP", "shape": [rows], "datatype": "FP32",
                    "parameters": {"binary_data_size": timesteps.nbytes}}],
        "outputs": [{"name": "EMBEDDING",
                     "parameters": {"binary_data": True}}]}).encode()
    (tmp_path / "big.bin").write_bytes(header + timesteps.tobytes())
    srv.wait_idle()  # so that the in-flight gauge counts the big call alone
    big = subprocess.Popen(  # pylint: disable=consider-using-with
        ["curl", "-sS", "--max-time", "60", "-o", str(tmp_path / "big.out"),
         "-w", "%{http_code}", "--data-binary", f"@{tmp_path / 'big.bin'}",
         "-H", f"Inference-Header-Content-Length: {len(header)}",
         "-H", "Expect:", srv.url + "/v2/models/ldm/infer"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # Wait until it computes (admitted: in flight), not merely sent.
        srv.wait_for_call(lambda: big.poll() is not None)
        assert big.poll() is None, (
            "the big request finished before SIGTERM: "
            f"{(tmp_path / 'big.out').read_bytes()[:300]!r}")
        srv.process.send_signal(15)
        seen = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and seen.count(503) < 3:
            status, _, body = curl(srv.url + "/v2/models/sd15/infer",
                                   method="POST", data=infer_body([1]))
            seen.append(status if status else body)
            if status == 503:
                assert "draining" in error_of(body)
                assert curl(srv.url + "/v2/health/ready")[0] in (503, 0)
            elif status == 0:
                break
        assert 503 in seen, seen
        out, err = big.communicate(timeout=60)
    finally:
        if big.poll() is None:
            big.kill()
    assert out == b"200", err
    body = (tmp_path / "big.out").read_bytes()
    assert len(body) > rows * dim * 4
    assert np.all(np.frombuffer(body[-dim * 4:], dtype="<f4") <= 1)
    assert srv.process.wait(timeout=30) == 0


def test_tls_and_mutual_tls(start_server, certs):
    srv = start_server(f"--tls_cert={certs['server.pem']}",
                       f"--tls_key={certs['server.key']}")
    https = f"https://127.0.0.1:{srv.http_port}"
    status, _, _ = curl(https + "/v2/health/ready",
                        tls=["--cacert", str(certs["ca.pem"])])
    assert status == 200
    status, _, body = curl(https + "/v2/models/sd15/infer", method="POST",
                           data=infer_body([5]),
                           tls=["--cacert", str(certs["ca.pem"])])
    assert status == 200, body
    # Plaintext HTTP to the TLS port gets no answer.
    assert curl(srv.url + "/v2/health/ready")[0] != 200

    mtls = start_server(f"--tls_cert={certs['server.pem']}",
                        f"--tls_key={certs['server.key']}",
                        f"--tls_client_ca={certs['ca.pem']}")
    https = f"https://127.0.0.1:{mtls.http_port}"
    assert curl(https + "/v2/health/ready",
                tls=["--cacert", str(certs["ca.pem"])])[0] == 0
    assert curl(https + "/v2/health/ready",
                tls=["--cacert", str(certs["ca.pem"]), "--cert",
                     str(certs["client.pem"]), "--key",
                     str(certs["client.key"])])[0] == 200


def test_keep_alive_connection_serves_many_requests(server):
    # One curl process, three URLs: one connection, reused.
    command = ["curl", "-sS", "-w", "%{num_connects} "]
    for path in ("/v2/health/live", "/v2", "/v2/models/sd15"):
        command += ["-o", "/dev/null", server.url + path]
    run = subprocess.run(
        command,
        capture_output=True, text=True, timeout=CURL_TIMEOUT, check=True)
    assert run.stdout.split() == ["1", "0", "0"], run.stdout


def test_chunked_request_body(server):
    status, _, body = curl(server.url + "/v2/models/sd15/infer",
                           method="POST", data=infer_body([42]),
                           headers=["Transfer-Encoding: chunked"])
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["shape"] == [1, 320]


def test_binary_length_mismatch_is_400(server):
    header = json.dumps({"inputs": [{
        "name": "TIMESTEP", "shape": [2], "datatype": "FP32",
        "parameters": {"binary_data_size": 8}}]}).encode()
    status, _, body = curl(
        server.url + "/v2/models/sd15/infer", method="POST",
        data=header + struct.pack("<f", 1.0),
        headers=[f"Inference-Header-Content-Length: {len(header)}"])
    assert status == 400 and "binary tensor data" in error_of(body)


@pytest.mark.parametrize("address,message", [
    ("unix:/tmp/temb-rest.sock", "HOST:PORT"),
    ("127.0.0.1", "HOST:PORT"),
    ("in-use", "cannot serve HTTP"),
])
def test_bad_http_address_stops_startup(server, address, message):
    if address == "in-use":
        address = server.http  # the session server holds it
    run = subprocess.run(
        [str(server.process.args[0]), "--address=127.0.0.1:0",
         "--metrics_address=", "--backend=cpu",
         f"--http_address={address}"],
        capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 1, run.stdout + run.stderr
    assert message in run.stdout + run.stderr
