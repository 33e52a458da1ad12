"""Client.condition against a real temb-server with a --model_repository of
tiny models that diffusers itself builds and saves: every output equal bit
for bit to what `temb condition --model_dir` computes in process (the
conditioning parity suite, tests/models/conditioning, ties that to
diffusers' own forward), and to the CLI's remote mode; the models listed
with their state; refusals with their codes and the field they name."""

import asyncio
import subprocess
import time

import numpy as np
import pytest

import temb
from temb_testing import TembServer

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
safetensors_torch = pytest.importorskip("safetensors.torch")

WIDTH = 64  # D: 2 heads of 32
POOLED = 48
TIMESTEPS = np.array([1000.0, 992.3125, 500.25, 41.7, 1.0, 0.0, 500.25],
                     dtype=np.float32)
GUIDANCE = 3.5


def qwen(dtype):
    torch.manual_seed(0)
    return diffusers.QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2,
        attention_head_dim=WIDTH // 2, num_attention_heads=2,
        joint_attention_dim=24, axes_dims_rope=(8, 12, 12)).to(dtype)


def flux_dev(dtype):
    torch.manual_seed(1)
    return diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=2,
        attention_head_dim=WIDTH // 2, num_attention_heads=2,
        joint_attention_dim=24, pooled_projection_dim=POOLED,
        guidance_embeds=True, axes_dims_rope=(8, 12, 12)).to(dtype)


# name -> (builder, dtype, takes guidance and pooled projections)
MODELS = {
    "qwen-bf16": (qwen, torch.bfloat16, False),
    "qwen-fp32": (qwen, torch.float32, False),
    "flux-dev-bf16": (flux_dev, torch.bfloat16, True),
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    for name, (build, dtype, _) in MODELS.items():
        build(dtype).save_pretrained(root / name)
    # A damaged copy: its weights file cut short.
    broken = root / "broken"
    qwen(torch.bfloat16).save_pretrained(broken)
    weights = broken / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    return root


@pytest.fixture(scope="module")
def pooled():
    """[N, P] pooled projections as a bf16 pipeline holds them."""
    generator = torch.Generator().manual_seed(7)
    return torch.randn(len(TIMESTEPS), POOLED, generator=generator).to(
        torch.bfloat16)


@pytest.fixture(scope="module")
def condition_server(server_binary, repository, tmp_path_factory):
    try:
        process = TembServer(server_binary,
                             tmp_path_factory.mktemp("condition-server"),
                             "--backend=cpu",
                             f"--model_repository={repository}",
                             start_timeout=60)
    except RuntimeError as error:
        pytest.fail(str(error))
    yield process
    process.stop(timeout=15)


@pytest.fixture(scope="module")
def cclient(condition_server):
    with temb.Client(condition_server.target, timeout=60) as c:
        deadline = time.monotonic() + 60
        while any(m.state == "loading" for m in c.models()):
            assert time.monotonic() < deadline, "models still loading"
            time.sleep(0.1)
        yield c


def cli_condition(cli_binary, source, out, name, pooled_file=None,
                  outputs=None):
    """`temb condition` in process (source: a folder) or remote (source:
    a server's target); the file it wrote."""
    command = [str(cli_binary), "condition",
               "--timesteps=" + ",".join(repr(float(t)) for t in TIMESTEPS),
               f"--out={out}"]
    if isinstance(source, str):
        command += [f"--target={source}", f"--model={name}"]
    else:
        command += [f"--model_dir={source / name}", "--threads=2"]
    if MODELS[name][2]:
        command += [f"--guidance={GUIDANCE}", f"--pooled={pooled_file}"]
    if outputs:
        command.append("--outputs=" + ",".join(outputs))
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out


def bits(tensor):
    """A torch tensor's elements as integers of their width: equal bits
    compare equal, and NaN or -0.0 cannot hide a difference."""
    view = {torch.bfloat16: torch.int16, torch.float16: torch.int16,
            torch.float32: torch.int32, torch.float64: torch.int64}
    return tensor.view(view.get(tensor.dtype, tensor.dtype))


def condition_args(name, pooled):
    if not MODELS[name][2]:
        return {}
    return dict(guidance=GUIDANCE, pooled_projections=pooled)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_condition_equals_the_cli_in_process_bit_for_bit(
        name, cclient, condition_server, repository, pooled, cli_binary,
        tmp_path):
    pooled_file = tmp_path / "pooled.npy"
    # The CLI reads float32: the bf16 values, widened exactly.
    np.save(pooled_file, pooled.to(torch.float32).numpy())
    local = safetensors_torch.load_file(str(cli_condition(
        cli_binary, repository, tmp_path / "local.safetensors", name,
        pooled_file)))
    got = cclient.condition(name, TIMESTEPS, return_tensors="pt",
                            **condition_args(name, pooled))
    assert list(got) == list(local)
    dtype = MODELS[name][1]
    for output, want in local.items():
        assert got[output].dtype == dtype, output
        assert got[output].shape == want.shape, output
        assert torch.equal(bits(got[output]), bits(want)), output

    # The CLI's remote mode writes the very same file.
    remote = cli_condition(cli_binary, condition_server.target,
                           tmp_path / "remote.safetensors", name, pooled_file)
    assert remote.read_bytes() == (tmp_path / "local.safetensors").read_bytes()

    # numpy: bf16 as the package represents it for embeddings.
    arrays = cclient.condition(name, TIMESTEPS, bf16_format="bits",
                               **condition_args(name, pooled))
    for output, want in local.items():
        expected = bits(want).numpy()
        if dtype == torch.bfloat16:
            assert arrays[output].dtype == np.uint16
            np.testing.assert_array_equal(arrays[output].view(np.int16),
                                          expected)
        else:
            assert arrays[output].dtype == np.float32
            np.testing.assert_array_equal(arrays[output].view(np.int32),
                                          expected)


def test_inputs_travel_exactly_in_their_own_dtype(cclient, pooled):
    name = "flux-dev-bf16"
    want = cclient.condition(name, TIMESTEPS, guidance=GUIDANCE,
                             pooled_projections=pooled.to(torch.float32),
                             return_tensors="pt")
    for variant in (pooled,  # bf16 bits on the wire
                    pooled.to(torch.float32).numpy(),
                    pooled.to(torch.float64)):  # float64 becomes float32
        got = cclient.condition(name, torch.from_numpy(TIMESTEPS),
                                guidance=np.float32(GUIDANCE),
                                pooled_projections=variant,
                                return_tensors="pt")
        for output in want:
            assert torch.equal(bits(got[output]), bits(want[output])), output
    # One pooled row shared by every timestep equals that row repeated.
    shared = cclient.condition(name, TIMESTEPS, guidance=GUIDANCE,
                               pooled_projections=pooled[0],
                               outputs=["temb"], return_tensors="pt")
    repeated = cclient.condition(
        name, TIMESTEPS, guidance=GUIDANCE,
        pooled_projections=pooled[:1].repeat(len(TIMESTEPS), 1),
        outputs=["temb"], return_tensors="pt")
    assert torch.equal(bits(shared["temb"]), bits(repeated["temb"]))


def test_outputs_subset_and_per_token_index(cclient):
    both = cclient.condition("qwen-fp32", TIMESTEPS,
                             outputs=["norm_out", "temb"])
    assert list(both) == ["temb", "norm_out"]  # the model's order
    tokens = np.array([[999.0, 0.0, 0.0], [999.0, 999.0, 0.0]], np.float32)
    per_token = cclient.condition("qwen-fp32", tokens, outputs=["norm_out"])
    assert list(per_token) == ["norm_out", "index"]
    np.testing.assert_array_equal(per_token["index"],
                                  np.array([[0, 1, 1], [0, 0, 1]]))
    assert per_token["index"].dtype == np.int64
    rows = cclient.condition("qwen-fp32", np.array([999.0, 0.0], np.float32),
                             outputs=["norm_out"])
    np.testing.assert_array_equal(per_token["norm_out"].view(np.int32),
                                  rows["norm_out"].view(np.int32))


def test_models_lists_state_family_outputs_and_bytes(cclient):
    models = {m.name: m for m in cclient.models()}
    assert sorted(models) == ["broken", "flux-dev-bf16", "qwen-bf16",
                              "qwen-fp32"]
    broken = models["broken"]
    assert broken.state == "failed"
    assert "diffusion_pytorch_model.safetensors" in broken.message
    flux = models["flux-dev-bf16"]
    assert (flux.state, flux.family, flux.dtype, flux.width) == \
        ("ready", "flux.1", "bf16", WIDTH)
    assert flux.weight_bytes > 0
    assert [i.name for i in flux.inputs] == [
        "timesteps", "guidance", "pooled_projections", "embedder_guidance",
        "timestep", "embedder_timestep"]
    # The forward's timestep and the embedder's, given instead of
    # timesteps, the embedder's guidance instead of the guidance scale, and
    # what each is.
    assert [(i.stands_for, i.instead_of) for i in flux.inputs] == [
        ("", ""), ("", ""), ("", ""), ("g_model", "guidance"),
        ("t_passed", "timesteps"), ("t_model", "timesteps")]
    # Where an offload patch captures them: the embedder's arguments.
    assert [(i.module, i.argument) for i in flux.inputs
            if i.argument] == [
        ("time_text_embed", "pooled_projection"),
        ("time_text_embed", "guidance"), ("time_text_embed", "timestep")]
    assert [i.in_model_dtype for i in flux.inputs] == [False] * 6
    assert flux.inputs[2].width == POOLED
    # The transformer class and the config fields it is computed for.
    assert flux.class_name == "FluxTransformer2DModel"
    assert flux.config["guidance_embeds"] == "true"
    assert flux.embedder_results == ()
    temb_output = flux.outputs[0]
    assert (temb_output.name, temb_output.dtype, temb_output.row_shape,
            temb_output.row_bytes) == ("temb", "bf16", (WIDTH,), 2 * WIDTH)
    assert flux.row_bytes == sum(o.row_bytes for o in flux.outputs)
    info = cclient.server_info()
    assert info.conditioning_model("qwen-fp32").dtype == "fp32"
    assert info.limits.max_request_bytes > 0
    assert info.conditioning_cache.capacity_bytes > 0


def test_refusals_name_the_model_and_the_field(cclient):
    with pytest.raises(temb.NotFoundError, match="qwen-bf16"):
        cclient.condition("nope", TIMESTEPS)
    with pytest.raises(temb.FailedPreconditionError,
                       match="diffusion_pytorch_model.safetensors"):
        cclient.condition("broken", TIMESTEPS)
    with pytest.raises(temb.InvalidArgumentError, match=r"inputs\[1\]"):
        cclient.condition("qwen-bf16", TIMESTEPS, guidance=GUIDANCE)
    with pytest.raises(temb.InvalidArgumentError, match=r"outputs\[0\]"):
        cclient.condition("qwen-bf16", TIMESTEPS, outputs=["t_emb"])
    with pytest.raises(temb.InvalidArgumentError, match="finite"):
        cclient.condition("qwen-bf16", [1.0, float("nan")])
    with pytest.raises(ValueError, match="2\\^24"):
        cclient.condition("qwen-bf16", [1 << 30])


def test_aio_client_answers_the_same(condition_server, cclient):
    want = cclient.condition("qwen-bf16", TIMESTEPS, return_tensors="pt")

    async def run():
        async with temb.aio.Client(condition_server.target,
                                   timeout=60) as client:
            models = await client.models()
            got = await client.condition("qwen-bf16", TIMESTEPS,
                                         return_tensors="pt")
            return models, got

    models, got = asyncio.run(run())
    assert "qwen-bf16" in [m.name for m in models]
    for output in want:
        assert torch.equal(bits(got[output]), bits(want[output])), output


def test_local_engine_answers_as_the_server(repository, cclient, pooled):
    import temb.local  # pylint: disable=import-outside-toplevel
    if not temb.local.available():
        pytest.skip("the _temb_local extension is not built")
    engine = temb.local.Engine(model_repository=str(repository),
                               cpu_threads=2)
    assert engine.models() == cclient.models()
    for name in sorted(MODELS):
        want = cclient.condition(name, TIMESTEPS, return_tensors="pt",
                                 **condition_args(name, pooled))
        got = engine.condition(name, TIMESTEPS, return_tensors="pt",
                               **condition_args(name, pooled))
        assert list(got) == list(want)
        for output in want:
            assert got[output].dtype == want[output].dtype
            assert torch.equal(bits(got[output]), bits(want[output])), \
                (name, output)
    with pytest.raises(temb.FailedPreconditionError,
                       match="diffusion_pytorch_model.safetensors"):
        engine.condition("broken", TIMESTEPS)
    with pytest.raises(temb.InvalidArgumentError, match=r"inputs\[1\]"):
        engine.condition("qwen-bf16", TIMESTEPS, guidance=GUIDANCE)
    assert "qwen-bf16" in [m.name for m in engine.server_info()
                           .conditioning_models]
    with pytest.raises(temb.NotFoundError, match="model_repository"):
        temb.local.Engine().condition("qwen-bf16", TIMESTEPS)


def test_a_request_over_the_size_limit_names_its_inputs(
        server_binary, repository, tmp_path, cli_binary):
    server = TembServer(server_binary, tmp_path, "--backend=cpu",
                        "--max_batch=64", f"--model_repository={repository}",
                        start_timeout=60)
    try:
        with temb.Client(server.target, timeout=60) as client:
            limit = client.server_info().limits.max_request_bytes
            rows = 64
            pooled = np.zeros((rows, 1 + limit // (4 * rows)), np.float32)
            with pytest.raises(temb.ResourceExhaustedError,
                               match=r"pooled_projections \[64, \d+\]: "
                                     r"\d+ bytes.*max_request_bytes"):
                client.condition("flux-dev-bf16", np.ones(rows, np.float32),
                                 guidance=GUIDANCE, pooled_projections=pooled)
        np.save(tmp_path / "pooled.npy", pooled)
        done = subprocess.run(
            [str(cli_binary), "condition", f"--target={server.target}",
             "--model=flux-dev-bf16", "--timesteps=" + ",".join(["1"] * rows),
             f"--guidance={GUIDANCE}", f"--pooled={tmp_path / 'pooled.npy'}",
             f"--out={tmp_path / 'out.safetensors'}"],
            capture_output=True, text=True, timeout=120)
        assert done.returncode == 1
        assert "pooled_projections" in done.stderr
        assert "max_request_bytes" in done.stderr
    finally:
        server.stop(timeout=15)


def test_condition_stream_answers_in_order_with_errors_in_place(
        cclient, condition_server):
    items = [dict(model="qwen-bf16", timesteps=TIMESTEPS[:i + 1],
                  request_id=f"r{i}", return_tensors="pt") for i in range(5)]
    items[2] = dict(model="broken", timesteps=TIMESTEPS, request_id="r2")
    results = list(cclient.condition_stream(items, raise_errors=False))
    assert len(results) == 5
    assert isinstance(results[2], temb.FailedPreconditionError)
    assert results[2].request_id == "r2"
    for i in (0, 1, 3, 4):
        want = cclient.condition(**items[i])
        assert list(results[i]) == list(want)
        for output in want:
            assert torch.equal(bits(results[i][output]), bits(want[output]))
    with pytest.raises(temb.FailedPreconditionError):
        list(cclient.condition_stream(items))

    async def run():
        async with temb.aio.Client(condition_server.target,
                                   timeout=60) as client:
            return [r async for r in client.condition_stream(
                items, raise_errors=False)]

    answers = asyncio.run(run())
    assert isinstance(answers[2], temb.FailedPreconditionError)
    assert torch.equal(bits(answers[4]["temb"]), bits(results[4]["temb"]))
