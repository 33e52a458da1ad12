"""Conditioning models managed live, as Triton's model control.

With --model_control_mode=explicit the KServe repository API (tritonclient's
get_model_repository_index, load_model and unload_model, over gRPC and REST)
lists, loads, reloads and unloads the repository's folders while the server
runs; with poll, a folder added or removed is followed by itself.  A model
whose folder is replaced and reloaded while clients call it loses no call,
and every answer is the old weights' rows or the new weights', whole.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
triton_grpc = pytest.importorskip("tritonclient.grpc")
triton_http = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "pylib"))
from temb_testing import TembServer  # noqa: E402

from test_conditioning_parity import qwen_model  # noqa: E402

T = np.float32([[999.0], [500.0], [1.0]])


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """Two Qwen-Image folders of other weights (and the same outputs)."""
    root = tmp_path_factory.mktemp("weights")
    qwen_model(torch.float32).save_pretrained(root / "first")
    qwen_model(torch.float32, zero_cond_t=True).save_pretrained(
        root / "second")
    return root


def start(weights, workdir, *flags):
    """A server over a repository holding the first weights as "qwen"."""
    repository = workdir / "repository"
    repository.mkdir()
    shutil.copytree(weights / "first", repository / "qwen")
    binary = os.environ.get("TEMB_SERVER_BIN")
    if not binary:
        pytest.skip("TEMB_SERVER_BIN is not set (run through ctest)")
    server = TembServer(binary, workdir, "--backend=cpu",
                        f"--model_repository={repository}",
                        "--http_address=127.0.0.1:0",
                        f"--http_port_file={workdir / 'http_port'}", *flags)
    server.http_target = "127.0.0.1:" + (
        workdir / "http_port").read_text().strip()
    client = triton_grpc.InferenceServerClient(server.target)
    for _ in range(600):
        if client.is_server_ready():
            break
        time.sleep(0.1)
    assert client.is_server_ready(), server.log()
    client.close()
    server.repository = repository
    return server


@pytest.fixture()
def explicit(weights, tmp_path):
    server = start(weights, tmp_path, "--model_control_mode=explicit")
    yield server
    server.stop()


def rows(client, model="qwen"):
    """Every output of `model` for T, by name."""
    inputs = [triton_grpc.InferInput("timesteps", list(T.shape), "FP32")]
    inputs[0].set_data_from_numpy(T)
    result = client.infer(model, inputs)
    return {output["name"]: result.as_numpy(output["name"]).tobytes()
            for output in result.get_response(as_json=True)["outputs"]}


def index(client):
    return {entry["name"]: entry.get("state", "")
            for entry in client.get_model_repository_index(
                as_json=True).get("models", [])}


def test_index_load_and_unload_over_grpc_and_rest(explicit, weights):
    grpc = triton_grpc.InferenceServerClient(explicit.target)
    http = triton_http.InferenceServerClient(explicit.http_target)
    assert index(grpc) == {"qwen": "READY"}
    before = rows(grpc)
    grpc.unload_model("qwen")
    assert not grpc.is_model_ready("qwen")
    with pytest.raises(InferenceServerException, match="is unloaded"):
        rows(grpc)
    assert index(grpc) == {"qwen": "UNAVAILABLE"}
    grpc.load_model("qwen")
    assert grpc.is_model_ready("qwen") and rows(grpc) == before
    # Over REST, and a folder added while the server runs.
    shutil.copytree(weights / "second", explicit.repository / "late")
    assert {m["name"]: m["state"] for m in http.get_model_repository_index()
            } == {"late": "UNAVAILABLE", "qwen": "READY"}
    http.load_model("late")
    assert http.is_model_ready("late") and rows(grpc, "late") != before
    http.unload_model("late")
    assert not http.is_model_ready("late")
    with pytest.raises(InferenceServerException, match="no such folder"):
        grpc.load_model("nowhere")
    with pytest.raises(InferenceServerException, match="no such folder"):
        http.load_model("nowhere")
    # The presets are not the repository's to load.
    with pytest.raises(InferenceServerException):
        grpc.unload_model("flux")
    grpc.close()
    http.close()


def test_load_and_unload_need_explicit_mode(weights, tmp_path):
    server = start(weights, tmp_path)  # --model_control_mode=none
    grpc = triton_grpc.InferenceServerClient(server.target)
    try:
        assert index(grpc) == {"qwen": "READY"}
        for call in (grpc.load_model, grpc.unload_model):
            with pytest.raises(InferenceServerException,
                               match="--model_control_mode=explicit"):
                call("qwen")
        assert grpc.is_model_ready("qwen")
    finally:
        grpc.close()
        server.stop()


def test_poll_mode_follows_folders_added_and_removed(weights, tmp_path):
    server = start(weights, tmp_path, "--model_control_mode=poll",
                   "--repository_poll_secs=1")
    repository = server.repository
    grpc = triton_grpc.InferenceServerClient(server.target)
    try:
        shutil.copytree(weights / "second", repository / "added")
        deadline = time.monotonic() + 60
        while not grpc.is_model_ready("added") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert grpc.is_model_ready("added"), server.log()
        shutil.rmtree(repository / "added")
        deadline = time.monotonic() + 60
        while "added" in index(grpc) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert index(grpc) == {"qwen": "READY"}
    finally:
        grpc.close()
        server.stop()


def test_a_reload_under_load_loses_no_call_and_mixes_no_weights(
        explicit, weights):
    """Four clients and `temb bench` call the model while its folder is
    replaced by other weights and reloaded: no call fails, each answer is
    the old or the new weights' rows whole, and once the load returned only
    the new ones."""
    control = triton_grpc.InferenceServerClient(explicit.target)
    old = rows(control)
    answers, errors = [], []
    stop = threading.Event()

    def call():
        client = triton_grpc.InferenceServerClient(explicit.target)
        while not stop.is_set():
            began = time.monotonic()
            try:
                answers.append((began, rows(client)))
            except Exception as e:  # every failure is a finding
                errors.append(repr(e))
        client.close()

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    # temb bench beside them, as an operator would watch a reload.
    cli = os.environ.get("TEMB_CLI_BIN")
    bench = None if not cli else subprocess.Popen(
        [cli, "bench", f"--target={explicit.target}", "--model=qwen",
         "--batch=3", "--concurrency=4", "--duration=3s", "--warmup=0s",
         "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    time.sleep(0.5)
    # The new weights beside the folder, then swapped in (hidden names are
    # not models).
    staged = explicit.repository / ".qwen.new"
    shutil.copytree(weights / "second", staged)
    os.rename(explicit.repository / "qwen", explicit.repository / ".qwen.old")
    os.rename(staged, explicit.repository / "qwen")
    control.load_model("qwen")
    loaded = time.monotonic()
    time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join()
    if bench is not None:
        out, err = bench.communicate(timeout=120)
        assert bench.returncode == 0, err
        report = json.loads(out)
        print(f"temb bench across the reload: {report['ok']} calls, "
              f"errors {report['errors']}, p99 "
              f"{report['latency_us']['p99']:.0f} us")
        assert report["errors"] == {} and report["ok"] > 0
    new = rows(control)
    control.close()
    assert errors == []
    assert new != old
    assert all(answer in (old, new) for _, answer in answers)
    assert any(answer == old for _, answer in answers)
    # A call that began after the load returned has the new weights.
    after = [answer for began, answer in answers if began > loaded]
    assert after and all(answer == new for answer in after)
    print(f"{len(answers)} calls while the folder was reloaded: "
          f"{sum(a == old for _, a in answers)} old, "
          f"{sum(a == new for _, a in answers)} new, 0 failed")
