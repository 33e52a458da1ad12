"""The Python client against a secured server: tls= (mutual TLS) and
auth_token= reach it, a wrong token gets UNAUTHENTICATED, and its retry
policy retries a server-sent CANCELLED only on the idempotent unary calls.
(A file of its own: the generated stubs of the other tests would shadow the
`temb` package.)"""
import json
import sys

import grpc
import pytest

from conftest import REPO
from temb_testing import generate_client_stubs

CLIENT_DIR = REPO / "client" / "python"
generate_client_stubs(CLIENT_DIR)
sys.path.insert(0, str(CLIENT_DIR))

import temb  # noqa: E402
from temb import _channel  # noqa: E402

TOKEN = "py-token-0123456789"


def test_retry_policy_retries_cancelled_only_on_idempotent_unary_calls():
    codes = {}
    for method_config in json.loads(_channel.service_config(3))["methodConfig"]:
        for name in method_config["name"]:
            key = (name["service"], name.get("method", "*"))
            codes[key] = set(method_config["retryPolicy"]["retryableStatusCodes"])
    service = "temb.v1.EmbeddingService"
    for method in ("Embed", "GetServerInfo"):
        assert codes[(service, method)] == {"UNAVAILABLE", "CANCELLED"}
    assert codes[(service, "*")] == {"UNAVAILABLE"}  # EmbedStream


def test_tls_and_token_options(start_server, certs, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    server = start_server(f"--tls_cert={certs['server']}",
                          f"--tls_key={certs['server.key']}",
                          f"--tls_client_ca={certs['ca']}",
                          f"--auth_token_file={token_file}")
    tls = temb.TlsConfig(root_certificates=certs["ca"].read_bytes(),
                         certificate_chain=certs["client"].read_bytes(),
                         private_key=certs["client.key"].read_bytes())
    with temb.Client(server.target, tls=tls, auth_token=TOKEN,
                     timeout=30) as client:
        assert client.embed([1, 2], preset="sdxl").shape == (2, 320)
        assert client.server_info().backend
    with temb.Client(server.target, tls=tls, auth_token="wrong", timeout=30,
                     retries=0) as client:
        with pytest.raises(temb.TembError) as e:
            client.embed([1], preset="sdxl")
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    no_cert = temb.TlsConfig(root_certificates=certs["ca"].read_bytes())
    with temb.Client(server.target, tls=no_cert, auth_token=TOKEN, timeout=10,
                     retries=0) as client:
        with pytest.raises(temb.TembError) as e:
            client.embed([1], preset="sdxl")
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
