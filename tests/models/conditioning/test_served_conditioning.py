"""Conditioning models served by temb-server from a model repository.

The repository holds tiny models that diffusers itself builds and saves
(Qwen-Image bf16 in shards, FLUX.1-dev bf16, and bf16 Qwen-Image-Layered,
HiDream-I1, Z-Image, Lumina-Image-2.0, Sana, LTX-Video, HunyuanVideo and
FramePack, Chroma, AuraFlow, LongCat-Image, Ovis-Image, Bria 3.2 and FIBO,
Motif-Video),
beside damaged copies and badly named folders.  Over KServe v2 gRPC
(tritonclient), REST (tritonclient.http and curl) and the CLI's in-process
computation of the same folder, the answers must be the same bits: the parity suite ties the
CLI to diffusers' own forward, so this ties every protocol to it.  Each
damaged model is refused on its own with a message naming its file, tensor
or field, while the good ones serve; a repeated 50-step schedule is taken
from the row cache whole (the server's metrics say so).
"""

import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
safetensors_torch = pytest.importorskip("safetensors.torch")
triton_grpc = pytest.importorskip("tritonclient.grpc")
triton_http = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "pylib"))
from temb_testing import TembServer, generate_stubs  # noqa: E402

from test_conditioning_parity import (FAMILIES, GUIDANCE,  # noqa: E402
                                      POOLED, TIMESTEPS, flux_model,
                                      qwen_model)

WEIGHTS = "diffusion_pytorch_model.safetensors"


def read_safetensors(path):
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def write_safetensors(path, header, data, length=None):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length)
                     + text + data)


def damaged_copies(good, repository):
    """Folders whose damage the loader must name: {name: expected words}."""
    cases = {}

    def copy(name):
        folder = repository / name
        shutil.copytree(good, folder)
        return folder

    folder = copy("truncated")
    weights = folder / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    cases["truncated"] = [WEIGHTS]

    folder = copy("header-past-file")
    header, data = read_safetensors(folder / WEIGHTS)
    write_safetensors(folder / WEIGHTS, header, data, length=1 << 26)
    cases["header-past-file"] = [WEIGHTS, "header length"]

    folder = copy("offsets-out-of-range")
    header, data = read_safetensors(folder / WEIGHTS)
    entry = header["norm_out.linear.weight"]
    entry["data_offsets"] = [entry["data_offsets"][0], len(data) + 64]
    write_safetensors(folder / WEIGHTS, header, data)
    cases["offsets-out-of-range"] = [WEIGHTS, "norm_out.linear.weight",
                                     "data_offsets"]

    folder = copy("overlapping")
    header, data = read_safetensors(folder / WEIGHTS)
    a, b = "norm_out.linear.weight", "norm_out.linear.bias"
    size = header[b]["data_offsets"][1] - header[b]["data_offsets"][0]
    start = header[a]["data_offsets"][0]
    header[b]["data_offsets"] = [start, start + size]
    write_safetensors(folder / WEIGHTS, header, data)
    cases["overlapping"] = [WEIGHTS, "data_offsets", "overlap"]

    folder = copy("missing-tensor")
    header, data = read_safetensors(folder / WEIGHTS)
    del header["norm_out.linear.bias"]
    write_safetensors(folder / WEIGHTS, header, data)
    cases["missing-tensor"] = ["norm_out.linear.bias"]

    folder = copy("shape-disagrees")
    config = json.loads((folder / "config.json").read_text())
    config["attention_head_dim"] *= 2
    (folder / "config.json").write_text(json.dumps(config))
    cases["shape-disagrees"] = ["shape"]

    folder = copy("malformed-config")
    (folder / "config.json").write_text('{"_class_name": ')
    cases["malformed-config"] = ["config.json"]

    folder = copy("unknown-family")
    config = json.loads((folder / "config.json").read_text())
    config["_class_name"] = "NotADiffusionModel"
    (folder / "config.json").write_text(json.dumps(config))
    cases["unknown-family"] = ["config.json", "_class_name",
                               "NotADiffusionModel"]

    # A name no URL or metric label should carry.
    copy("bad name")
    cases["bad name"] = ["letters, digits"]
    return cases


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    # Qwen-Image in bf16, sharded (the index.json path), and FLUX.1-dev.
    qwen_model(torch.bfloat16).save_pretrained(root / "qwen", max_shard_size="30KB")
    flux_model(torch.bfloat16, True).save_pretrained(root / "flux-dev")
    # Qwen-Image-Layered: one more input, an index into a two-row table;
    # HiDream-I1 with its pooled embedding; Z-Image, Lumina-Image-2.0 and
    # Sana with their pipelines' arithmetic on t; Sana-Sprint's guidance
    # embedder; LTX-Video's tables.
    for kind, name in (("qwen-image-layered", "qwen-layered"),
                       ("hidream-i1", "hidream-cond"),
                       ("z-image", "z-image-cond"),
                       ("lumina2", "lumina2-cond"), ("sana", "sana-cond"),
                       ("sana-sprint", "sana-sprint-cond"),
                       ("ltx-video", "ltx-video-cond"),
                       ("hunyuanvideo", "hunyuanvideo-cond"),
                       ("hunyuanvideo-i2v", "hunyuanvideo-i2v-cond"),
                       ("hunyuanvideo-token-replace", "hunyuanvideo-tr-cond"),
                       ("hunyuanvideo-1.5-sr", "hunyuanvideo-1.5-sr-cond"),
                       ("chroma", "chroma-cond"),
                       ("auraflow", "auraflow-cond"),
                       ("longcat-image", "longcat-image-cond"),
                       ("ovis-image", "ovis-image-cond"),
                       ("bria", "bria-cond"), ("bria-fibo", "bria-fibo-cond"),
                       ("motif-video", "motif-video-cond"),
                       ("hunyuanvideo-framepack", "framepack-cond")):
        FAMILIES[kind].build(torch.bfloat16).save_pretrained(root / name)
    good = tmp_path_factory.mktemp("qwen-fp32")
    qwen_model(torch.float32).save_pretrained(good)
    shutil.copytree(good, root / "qwen32")
    # Named like a preset, as docs/offload.md's example folder is: the
    # folder's model takes the name on KServe and REST.
    shutil.copytree(good, root / "qwen-image")
    cases = damaged_copies(good, root)
    return root, cases


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    binary = os.environ.get("TEMB_SERVER_BIN")
    if not binary:
        pytest.skip("TEMB_SERVER_BIN is not set (run through ctest)")
    root, _ = repository
    workdir = tmp_path_factory.mktemp("server")
    # The damaged models fail: serve the good ones (strict readiness,
    # the default, is test_repository.py's in tests/reliability).
    srv = TembServer(binary, workdir, "--backend=cpu",
                     f"--model_repository={root}", "--serve_ready_models",
                     "--http_address=127.0.0.1:0",
                     f"--http_port_file={workdir / 'http_port'}",
                     metrics=True)
    # The REST port is written before the gRPC one, which TembServer waited
    # for; the models load after both.
    srv.http_target = "127.0.0.1:" + (workdir / "http_port").read_text().strip()
    client = triton_grpc.InferenceServerClient(srv.target)
    for _ in range(600):
        if client.is_server_ready():
            break
        time.sleep(0.1)
    assert client.is_server_ready(), srv.log()
    yield srv
    client.close()
    srv.stop()


@pytest.fixture(scope="module")
def grpc_client(server):
    client = triton_grpc.InferenceServerClient(server.target)
    yield client
    client.close()


@pytest.fixture(scope="module")
def http_client(server):
    client = triton_http.InferenceServerClient(server.http_target)
    yield client
    client.close()


def pooled_rows():
    generator = torch.Generator().manual_seed(5)
    return torch.randn(len(TIMESTEPS), POOLED, generator=generator).to(
        torch.bfloat16)


# Qwen-Image-Layered's index per timestep: both rows of its table.
LAYERED_INDEX = np.array([i % 2 for i in range(len(TIMESTEPS))],
                         dtype=np.float32)


def cli_outputs(temb_cli, folder, tmp_path, guidance=None, pooled=None,
                extra=None):
    command = [str(temb_cli), "condition", f"--model_dir={folder}",
               "--timesteps=" + ",".join(repr(t) for t in TIMESTEPS),
               f"--out={tmp_path / 'cli.safetensors'}"]
    if extra:
        command.append("--inputs=" + ";".join(
            f"{name}=" + ",".join(repr(float(v)) for v in values)
            for name, values in extra.items()))
    if guidance is not None:
        command.append(f"--guidance={guidance}")
    if pooled is not None:
        np.save(tmp_path / "pooled.npy", pooled.float().numpy())
        command.append(f"--pooled={tmp_path / 'pooled.npy'}")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return {name: tensor.view(torch.int16).numpy() if tensor.dtype ==
            torch.bfloat16 else tensor.numpy()
            for name, tensor in safetensors_torch.load_file(
                str(tmp_path / "cli.safetensors")).items()}


def bf16_bits(array):
    """tritonclient returns BF16 as float32 holding the value: its top
    16 bits."""
    return (np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
            >> 16).astype(np.uint16).view(np.int16)


def infer(module, client, model, guidance=None, pooled=None, outputs=None,
          timesteps=TIMESTEPS, shape=None, extra=None, time_name="timesteps"):
    t = np.asarray(timesteps, dtype=np.float32).reshape(
        shape or [len(timesteps)])
    inputs = [module.InferInput(time_name, list(t.shape), "FP32")]
    inputs[0].set_data_from_numpy(t)
    if guidance is not None:
        g = np.full([len(timesteps)], guidance, dtype=np.float32)
        inputs.append(module.InferInput("guidance", list(g.shape), "FP32"))
        inputs[-1].set_data_from_numpy(g)
    if pooled is not None:
        p = pooled.float().numpy()
        inputs.append(module.InferInput("pooled_projections", list(p.shape),
                                        "FP32"))
        inputs[-1].set_data_from_numpy(p)
    for name, values in (extra or {}).items():
        inputs.append(module.InferInput(name, list(values.shape), "FP32"))
        inputs[-1].set_data_from_numpy(values)
    requested = None
    if outputs:
        requested = [module.InferRequestedOutput(name) for name in outputs]
    return client.infer(model, inputs, outputs=requested)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_every_protocol_answers_the_clis_bits(protocol, server, repository,
                                              grpc_client, http_client,
                                              temb_cli, tmp_path):
    root, _ = repository
    module, client = ((triton_grpc, grpc_client) if protocol == "grpc"
                      else (triton_http, http_client))
    pooled = pooled_rows()
    layered = {"addition_t_cond": LAYERED_INDEX}
    # The super-resolution model's second timestep, one per row.
    meanflow = {"timestep_r": np.array(
        FAMILIES["hunyuanvideo-1.5-sr"].next_timesteps(len(TIMESTEPS)),
        dtype=np.float32)}
    for model, guidance, rows, extra in (
            ("qwen", None, None, None),
            ("flux-dev", GUIDANCE, pooled, None),
            ("qwen-layered", None, None, layered),
            ("hidream-cond", None, pooled, None),
            ("z-image-cond", None, None, None),
            ("lumina2-cond", None, None, None),
            ("sana-cond", None, None, None),
            ("sana-sprint-cond", GUIDANCE, None, None),
            ("ltx-video-cond", None, None, None),
            ("hunyuanvideo-cond", GUIDANCE, pooled, None),
            ("hunyuanvideo-i2v-cond", None, pooled, None),
            ("hunyuanvideo-tr-cond", GUIDANCE, pooled, None),
            ("hunyuanvideo-1.5-sr-cond", None, None, meanflow),
            ("chroma-cond", None, None, None),
            ("auraflow-cond", None, None, None),
            ("longcat-image-cond", None, None, None),
            ("ovis-image-cond", None, None, None),
            ("bria-cond", None, None, None),
            ("bria-fibo-cond", None, None, None),
            ("motif-video-cond", None, None, None),
            ("framepack-cond", GUIDANCE, pooled, None)):
        expected = cli_outputs(temb_cli, root / model, tmp_path, guidance,
                               rows, extra)
        result = infer(module, client, model, guidance, rows, extra=extra)
        names = [o["name"] for o in result.get_response(as_json=True)[
            "outputs"]] if protocol == "grpc" else [
            o["name"] for o in result.get_response()["outputs"]]
        assert sorted(names) == sorted(expected), model
        for name, bits in expected.items():
            got = result.as_numpy(name)
            assert got.shape == bits.shape, (model, name)
            assert np.array_equal(bf16_bits(got), bits), (model, name)


def test_metadata_config_and_readiness(server, grpc_client, http_client,
                                      repository):
    _, cases = repository
    metadata = grpc_client.get_model_metadata("flux-dev", as_json=True)
    inputs = {i["name"]: i for i in metadata["inputs"]}
    assert set(inputs) == {"timesteps", "guidance", "pooled_projections"}
    assert inputs["pooled_projections"]["shape"] == ["-1", str(POOLED)]
    # The config's dims behind the batch dimension, as Triton writes them:
    # perf_analyzer builds its requests from these shapes.
    assert inputs["timesteps"]["shape"] == ["-1", "1"]
    assert inputs["guidance"]["shape"] == ["-1", "1"]
    outputs = {o["name"]: o for o in metadata["outputs"]}
    assert outputs["img_mod"]["datatype"] == "BF16"
    assert outputs["img_mod"]["shape"] == ["-1", "2", str(6 * 256)]
    config = grpc_client.get_model_config("qwen", as_json=True)["config"]
    assert [i["name"] for i in config["input"]] == ["timesteps"]
    # The weights' fingerprints as config parameters, one per tensor read,
    # the same over REST.
    parameters = {key: value["string_value"]
                  for key, value in config["parameters"].items()}
    # The forward's timestep, an alternative to timesteps, is named there,
    # with where a patch captures it; the transformer class and the config
    # fields the model is computed for; and what each output replaces in
    # the transformer.
    described = {key: parameters.pop(key) for key in list(parameters)
                 if key.startswith(("config:", "class_name", "stands_for:",
                                    "instead_of:", "module:", "argument:"))}
    assert {key: value for key, value in described.items()
            if not key.startswith("config:")} == {
        "stands_for:timestep": "t_model",
        "instead_of:timestep": "timesteps",
        "module:timestep": "time_text_embed",
        "argument:timestep": "timestep",
        "class_name": "QwenImageTransformer2DModel"}
    assert described["config:num_layers"] == "3"
    assert described["config:guidance_embeds"] == "false"
    replaced = {key: parameters.pop(key) for key in list(parameters)
                if not key.startswith("weight_fingerprint:")}
    assert replaced == {
        "replaces:temb": "time_text_embed",
        "replaced_kind:temb": "embedder",
        "replaces:img_mod": "transformer_blocks.{i}.img_mod.1",
        "replaced_kind:img_mod": "linear",
        "blocks:img_mod": "0,1,2",
        "input_module:img_mod": "transformer_blocks.{i}.img_mod.0",
        "replaces:txt_mod": "transformer_blocks.{i}.txt_mod.1",
        "replaced_kind:txt_mod": "linear",
        "blocks:txt_mod": "0,1,2",
        "input_module:txt_mod": "transformer_blocks.{i}.txt_mod.0",
        "replaces:norm_out": "norm_out.linear",
        "replaced_kind:norm_out": "linear",
        "input_module:norm_out": "norm_out.silu"}, replaced
    fingerprints = parameters
    assert ("weight_fingerprint:time_text_embed.timestep_embedder.linear_1."
            "weight") in fingerprints
    assert all(key.startswith("weight_fingerprint:") and len(value) == 16
               for key, value in fingerprints.items())
    rest = http_client.get_model_config("qwen")
    assert {key: value["string_value"] for key, value in
            rest["parameters"].items()} == dict(
                fingerprints, **replaced, **described)
    assert grpc_client.is_model_ready("qwen")
    assert grpc_client.is_model_ready("flux-dev")
    for name in cases:
        assert not grpc_client.is_model_ready(name), name
    assert not grpc_client.is_model_ready("../qwen")
    stats = grpc_client.get_inference_statistics("qwen", as_json=True)
    assert stats["model_stats"][0]["name"] == "qwen"


def test_readiness_health_entry_serves_once_the_models_settled(
        server, tmp_path_factory):
    """Kubernetes' readiness probe asks grpc.health.v1 for "temb.models"."""
    import grpc  # pylint: disable=import-outside-toplevel
    generate_stubs(tmp_path_factory.mktemp("health_stubs"),
                   "grpc/health/v1/health.proto", prefix="served_health")
    # pylint: disable=import-outside-toplevel
    from served_health.grpc.health.v1 import health_pb2, health_pb2_grpc
    with grpc.insecure_channel(server.target) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="temb.models"), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_forward_timestep_is_served_as_the_scheduler_t(
        protocol, server, grpc_client, http_client):
    """`timestep`, the transformer forward's argument as the pipeline passes
    it (t.to(bf16) / 1000 for Qwen-Image and FLUX.1), answers the bits of
    `timesteps`, per row and per token; giving both is refused."""
    module, client = ((triton_grpc, grpc_client) if protocol == "grpc"
                      else (triton_http, http_client))
    forward = (torch.tensor(TIMESTEPS).to(torch.bfloat16) / 1000).float()
    pooled = pooled_rows()
    for model, guidance, rows in (("qwen", None, None),
                                  ("flux-dev", GUIDANCE, pooled)):
        by_t = infer(module, client, model, guidance, rows)
        by_forward = infer(module, client, model, guidance, rows,
                           timesteps=forward.tolist(), time_name="timestep")
        for output in ("norm_out", "img_mod"):
            assert np.array_equal(bf16_bits(by_forward.as_numpy(output)),
                                  bf16_bits(by_t.as_numpy(output))), model
    tokens = forward[[0, 6, 6, 0]].tolist()
    per_token = infer(module, client, "qwen", timesteps=tokens, shape=[2, 2],
                      outputs=["norm_out", "index"], time_name="timestep")
    assert per_token.as_numpy("index").tolist() == [[0, 1], [1, 0]]
    plain = infer(module, client, "qwen",
                  timesteps=[TIMESTEPS[0], TIMESTEPS[6]],
                  outputs=["norm_out"])
    assert np.array_equal(bf16_bits(per_token.as_numpy("norm_out")),
                          bf16_bits(plain.as_numpy("norm_out")))
    t = np.asarray(TIMESTEPS[:2], dtype=np.float32)
    both = [module.InferInput("timesteps", [2], "FP32"),
            module.InferInput("timestep", [2], "FP32")]
    both[0].set_data_from_numpy(t)
    both[1].set_data_from_numpy(t / 1000)
    with pytest.raises(InferenceServerException, match="takes one of them"):
        client.infer("qwen", both)


def test_per_token_timesteps_give_distinct_rows_and_an_index(server,
                                                             grpc_client):
    tokens = [999.0, 0.0, 0.0, 999.0, 999.0, 0.0]
    result = infer(triton_grpc, grpc_client, "qwen", timesteps=tokens,
                   shape=[2, 3], outputs=["norm_out", "index"])
    index = result.as_numpy("index")
    assert index.dtype == np.int64
    assert index.tolist() == [[0, 1, 1], [0, 0, 1]]
    rows = bf16_bits(result.as_numpy("norm_out"))
    plain = bf16_bits(infer(triton_grpc, grpc_client, "qwen",
                            timesteps=[999.0, 0.0],
                            outputs=["norm_out"]).as_numpy("norm_out"))
    assert np.array_equal(rows, plain)


def test_statistics_count_the_timesteps_asked_for(server, grpc_client):
    """KServe's inference_count of a conditioning model grows by the
    timesteps of a request (N, or per token B * L), not by the rows of
    every output added up."""
    def count():
        stats = grpc_client.get_inference_statistics("qwen", as_json=True)
        return int(stats["model_stats"][0].get("inference_count", 0))

    before = count()
    infer(triton_grpc, grpc_client, "qwen")
    assert count() - before == len(TIMESTEPS)
    before = count()
    infer(triton_grpc, grpc_client, "qwen",
          timesteps=[999.0, 0.0, 0.0, 999.0, 999.0, 0.0], shape=[2, 3],
          outputs=["norm_out", "index"])
    assert count() - before == 6


def test_damaged_models_are_refused_naming_the_cause(server, grpc_client,
                                                     repository):
    _, cases = repository
    for name, words in cases.items():
        with pytest.raises(InferenceServerException) as error:
            infer(triton_grpc, grpc_client, name)
        assert error.value.status() == "StatusCode.FAILED_PRECONDITION", name
        for word in words:
            assert word in error.value.message(), (name, word,
                                                   error.value.message())
    # The preset named "flux" is still the preset; the folder named
    # "qwen-image" is the conditioning model under that name.
    assert grpc_client.get_model_metadata("flux", as_json=True)[
        "inputs"][0]["name"] == "TIMESTEP"
    assert grpc_client.get_model_metadata("qwen-image", as_json=True)[
        "inputs"][0]["name"] == "timesteps"
    named = infer(triton_grpc, grpc_client, "qwen-image", outputs=["temb"])
    plain = infer(triton_grpc, grpc_client, "qwen32", outputs=["temb"])
    assert np.array_equal(named.as_numpy("temb"), plain.as_numpy("temb"))
    # A request naming a path is an unknown model.
    with pytest.raises(InferenceServerException) as error:
        infer(triton_grpc, grpc_client, "../qwen")
    assert error.value.status() == "StatusCode.NOT_FOUND"
    # And the good models still serve.
    assert infer(triton_grpc, grpc_client, "qwen").as_numpy("temb") is not None


def test_the_row_cache_tells_layered_indices_apart(server, grpc_client):
    """Qwen-Image-Layered's rows depend on t and on addition_t_cond: the
    row cache keys both, so the same t with the other index is another
    row, and a row asked for again, alone or in another order, has the
    same bits."""
    def rows(timesteps, index):
        result = infer(triton_grpc, grpc_client, "qwen-layered",
                       timesteps=timesteps, outputs=["temb", "img_mod"],
                       extra={"addition_t_cond": np.array(
                           index, dtype=np.float32)})
        return {name: bf16_bits(result.as_numpy(name))
                for name in ("temb", "img_mod")}

    both = rows([500.0, 500.0], [0, 1])
    swapped = rows([500.0, 500.0], [1, 0])
    alone = rows([500.0], [1])
    for name, bits in both.items():
        assert not np.array_equal(bits[0], bits[1]), name
        assert np.array_equal(bits[0], swapped[name][1]), name
        assert np.array_equal(bits[1], swapped[name][0]), name
        assert np.array_equal(bits[1], alone[name][0]), name


def test_rest_refusals_have_their_http_codes(server):
    def post(model, body):
        done = subprocess.run(
            ["curl", "-s", "-o", "-", "-w", "\n%{http_code}",
             "-H", "Content-Type: application/json", "--data", body,
             f"http://{server.http_target}/v2/models/{model}/infer"],
            capture_output=True, text=True, timeout=30, check=True)
        text, code = done.stdout.rsplit("\n", 1)
        return int(code), json.loads(text) if text else {}

    body = json.dumps({"inputs": [{"name": "timesteps", "shape": [2],
                                   "datatype": "FP32", "data": [999, 1]}]})
    # float32 outputs travel as JSON (bf16 ones only as binary data).
    code, answer = post("qwen32", body)
    assert code == 200, answer
    assert {o["name"] for o in answer["outputs"]} >= {"temb", "img_mod"}
    code, answer = post("missing-tensor", body)
    assert code == 400 and "norm_out.linear.bias" in answer["error"]
    code, answer = post("..%2Fqwen", body)
    assert code in (400, 404), answer
    bad = json.dumps({"inputs": [{"name": "guidance", "shape": [1],
                                  "datatype": "FP32", "data": [3.5]}]})
    code, answer = post("qwen", bad)
    assert code == 400 and "inputs[0]" in answer["error"]
    # Qwen-Image-Layered's index outside its table's two rows.
    index = json.dumps({"inputs": [
        {"name": "timesteps", "shape": [2], "datatype": "FP32",
         "data": [999, 1]},
        {"name": "addition_t_cond", "shape": [2], "datatype": "FP32",
         "data": [0, 2]}]})
    code, answer = post("qwen-layered", index)
    assert code == 400 and ("addition_t_cond[1] must be an integer in "
                            "[0, 2), got 2") in answer["error"], answer


def test_repeated_schedule_is_taken_from_the_cache(server, grpc_client):
    schedule = [1000.0 * (1 - i / 50) + 0.125 for i in range(50)]
    before = server.metrics()
    first = infer(triton_grpc, grpc_client, "qwen", timesteps=schedule)
    middle = server.metrics()
    second = infer(triton_grpc, grpc_client, "qwen", timesteps=schedule)
    after = server.metrics()

    def count(metrics, name):
        return metrics.get((name, frozenset()), 0.0)

    # The bf16 model rounds t to bf16 first (as its pipeline does), so
    # some of these rows may be cached from earlier tests already.
    assert (count(middle, "temb_conditioning_cache_misses_total")
            + count(middle, "temb_conditioning_cache_hits_total")
            - count(before, "temb_conditioning_cache_misses_total")
            - count(before, "temb_conditioning_cache_hits_total")) == 50
    assert count(after, "temb_conditioning_cache_misses_total") == \
        count(middle, "temb_conditioning_cache_misses_total")
    assert count(after, "temb_conditioning_cache_hits_total") - \
        count(middle, "temb_conditioning_cache_hits_total") == 50
    for name in ("temb", "img_mod", "txt_mod", "norm_out"):
        assert np.array_equal(bf16_bits(first.as_numpy(name)),
                              bf16_bits(second.as_numpy(name)))
    assert count(after, "temb_conditioning_cache_bytes") > 0


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_drives_a_conditioning_model(server, tmp_path, protocol):
    """Triton's perf_analyzer builds its requests from ModelMetadata and
    ModelConfig: with the pipeline's inputs as its input data it load-tests
    a conditioning model over both protocols and reports."""
    import csv  # pylint: disable=import-outside-toplevel
    from temb_perf_analyzer import (  # pylint: disable=import-outside-toplevel
        find_perf_analyzer, perf_analyzer_env)
    import tiny_conditioning  # pylint: disable=import-outside-toplevel
    assert tiny_conditioning.POOLED == POOLED
    data = tmp_path / "input.json"
    data.write_text(json.dumps(tiny_conditioning.input_data(16)))
    target = server.target if protocol == "grpc" else server.http_target
    out = tmp_path / "out.csv"
    run = subprocess.run(
        [find_perf_analyzer(), "-i", protocol, "-u", target, "-m", "flux-dev",
         "-b", "4", "--concurrency-range", "2", "--measurement-interval",
         "1000", "--stability-percentage", "100", "--input-data", str(data),
         "-f", str(out)],
        env=perf_analyzer_env(), capture_output=True, text=True, timeout=180,
        check=False)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    assert "Concurrency: 2, throughput:" in report, report
    with open(out, newline="", encoding="utf-8") as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["Inferences/Second"]) > 0, row
