"""TLS, mutual TLS and bearer tokens, end to end with the real binaries.

Must show: a plaintext client is refused by a TLS server; a client without
a certificate is refused under mTLS; a wrong or missing token gets
UNAUTHENTICATED; and good clients are served throughout (a `temb bench`
with the right credentials runs beside the bad clients with zero errors).
"""
import json
import subprocess

import grpc
import pytest

from conftest import TEMB, temb

TOKEN = "tok-" + "7" * 40


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\nrotated-token\n")
    return path


def start_bench(target, *flags, duration="6s"):
    return subprocess.Popen(
        [str(TEMB), "bench", "--target", target, f"--duration={duration}",
         "--warmup=0s", "--concurrency=4", "--json", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def bench_report(bench):
    out, err = bench.communicate(timeout=120)
    assert bench.returncode == 0, (err, out)
    report = json.loads(out)
    assert report["ok"] > 0 and not report["errors"], report
    return report


def test_tls_refuses_plaintext_and_serves_tls_clients(start_server, certs):
    server = start_server(f"--tls_cert={certs['server']}",
                          f"--tls_key={certs['server.key']}")
    tls = [f"--tls_ca={certs['ca']}"]
    bench = start_bench(server.target, *tls)
    try:
        plain = temb("info", "--target", server.target)
        assert plain.returncode == 1
        assert "UNAVAILABLE" in plain.stderr, plain.stderr
        # The server's certificate does not verify against another CA.
        wrong_ca = temb("info", "--target", server.target,
                        f"--tls_ca={certs['other_ca']}")
        assert wrong_ca.returncode == 1 and "UNAVAILABLE" in wrong_ca.stderr
        good = temb("embed", "--target", server.target, *tls, "--preset=sdxl",
                    "--timesteps=1,500", "--format=json")
        assert good.returncode == 0, good.stderr
        assert json.loads(good.stdout)["shape"] == [2, 320]
        # A name in the certificate other than the target's host.
        by_name = temb("health", "--target", server.target, *tls,
                       "--tls_server_name=localhost")
        assert by_name.returncode == 0 and "SERVING" in by_name.stdout
    finally:
        report = bench_report(bench)
    assert report["requests"] == report["ok"]


def test_mtls_requires_a_client_certificate_from_the_ca(start_server, certs):
    server = start_server(f"--tls_cert={certs['server']}",
                          f"--tls_key={certs['server.key']}",
                          f"--tls_client_ca={certs['ca']}")
    tls = [f"--tls_ca={certs['ca']}"]
    mine = [f"--tls_cert={certs['client']}", f"--tls_key={certs['client.key']}"]
    rogue = [f"--tls_cert={certs['rogue_client']}",
             f"--tls_key={certs['rogue_client.key']}"]
    bench = start_bench(server.target, *tls, *mine)
    try:
        for bad in ([], rogue):
            refused = temb("info", "--target", server.target, *tls, *bad)
            assert refused.returncode == 1, refused.stdout
            assert "UNAVAILABLE" in refused.stderr, refused.stderr
        plain = temb("info", "--target", server.target)
        assert plain.returncode == 1 and "UNAVAILABLE" in plain.stderr
        good = temb("info", "--target", server.target, *tls, *mine)
        assert good.returncode == 0, good.stderr
    finally:
        bench_report(bench)


def test_tokens_are_checked_on_every_api_but_not_on_health(
        start_server, token_file, tmp_path, pb):
    v1, v1_grpc, kserve, kserve_grpc = pb
    server = start_server(f"--auth_token_file={token_file}")
    good_file = tmp_path / "client_token"
    good_file.write_text(TOKEN + "\n")
    bad_file = tmp_path / "bad_token"
    bad_file.write_text("tok-" + "7" * 39 + "8\n")
    bench = start_bench(server.target, f"--auth_token_file={good_file}")
    try:
        for flags in ([], [f"--auth_token_file={bad_file}"]):
            refused = temb("embed", "--target", server.target, "--preset=sdxl",
                           "--timesteps=1", *flags)
            assert refused.returncode == 1
            assert "UNAUTHENTICATED" in refused.stderr, refused.stderr
            assert TOKEN not in refused.stderr
        health = temb("health", "--target", server.target)
        assert health.returncode == 0 and "SERVING" in health.stdout
        ok = temb("info", "--target", server.target,
                  f"--auth_token_file={good_file}")
        assert ok.returncode == 0, ok.stderr

        with grpc.insecure_channel(server.target) as channel:
            native = v1_grpc.EmbeddingServiceStub(channel)
            infer = kserve_grpc.GRPCInferenceServiceStub(channel)
            request = kserve.ModelInferRequest(model_name="sdxl")
            for metadata in ((), (("authorization", "Bearer nope"),),
                             (("authorization", TOKEN),)):
                for call, message in (
                        (native.GetServerInfo, v1.GetServerInfoRequest()),
                        (infer.ServerMetadata, kserve.ServerMetadataRequest()),
                        (infer.ModelInfer, request)):
                    with pytest.raises(grpc.RpcError) as e:
                        call(message, metadata=metadata, timeout=10)
                    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # Both tokens of the file work, on both APIs.
            for token in (TOKEN, "rotated-token"):
                metadata = (("authorization", f"Bearer {token}"),)
                native.GetServerInfo(v1.GetServerInfoRequest(),
                                     metadata=metadata, timeout=10)
                ready = infer.ServerReady(kserve.ServerReadyRequest(),
                                          metadata=metadata, timeout=10)
                assert ready.ready
    finally:
        bench_report(bench)
    assert server.metric("temb_rejected_requests_total",
                         reason="unauthenticated") >= 8
