"""temb.torch.Timesteps and return_tensors="pt" (skipped without PyTorch);
parity with diffusers where it is installed."""

import importlib
import math

import numpy as np
import pytest

import temb
import temb_reference as reference

LDM = dict(flip_sin_to_cos=True, downscale_freq_shift=0.0)


def test_import_error_without_torch():
    try:
        importlib.import_module("torch")
        pytest.skip("PyTorch is installed")
    except ImportError:
        pass
    with pytest.raises(ImportError, match=r"temb\[torch\]"):
        importlib.import_module("temb.torch")


def eager_get_timestep_embedding(torch, timesteps, dim, flip_sin_to_cos,
                                 downscale_freq_shift, scale=1, max_period=10000):
    """diffusers' get_timestep_embedding, restated in eager PyTorch float32."""
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(0, half, dtype=torch.float32)
    exponent = exponent / (half - downscale_freq_shift)
    emb = timesteps[:, None].float() * torch.exp(exponent)[None, :]
    emb = scale * emb
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
    if dim % 2 == 1:
        emb = torch.nn.functional.pad(emb, (0, 1, 0, 0))
    return emb


def test_return_tensors_pt(client):
    torch = pytest.importorskip("torch")
    t = [0.0, 1.0, 999.0]
    fp32 = client.embed(t, dim=16, **LDM)
    got = client.embed(t, dim=16, return_tensors="pt", **LDM)
    assert got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), fp32)
    bf16 = client.embed(t, dim=16, dtype="bf16", return_tensors="pt", **LDM)
    assert bf16.dtype == torch.bfloat16
    np.testing.assert_array_equal(bf16.view(torch.int16).numpy().view(np.uint16),
                                  reference.to_bf16_bits(fp32))
    assert torch.equal(bf16, torch.from_numpy(fp32).to(torch.bfloat16))
    fp16 = client.embed(t, dim=16, dtype="fp16", return_tensors="pt", **LDM)
    assert torch.equal(fp16, torch.from_numpy(fp32).half())


@pytest.mark.parametrize("num_channels, flip, shift, scale", [
    (320, True, 0, 1), (128, False, 1, 1), (7, False, 1, 1), (256, True, 1, 1),
    (64, True, 0, 1000)])
def test_timesteps_module_matches_eager_pytorch(client, num_channels, flip,
                                                shift, scale):
    torch = pytest.importorskip("torch")
    from temb.torch import Timesteps
    module = Timesteps(num_channels, flip, shift, scale, client=client)
    timesteps = torch.tensor([0, 1, 250, 999])  # int64, as schedulers give
    got = module(timesteps)
    assert got.dtype == torch.float32 and got.shape == (4, num_channels)
    bound = 1e-6 + 5e-7 * 999 * scale  # the guide's fp32 bound at t = 999
    want = reference.embedding(timesteps.numpy(), num_channels,
                               flip_sin_to_cos=flip, downscale_freq_shift=shift,
                               scale=scale)
    np.testing.assert_allclose(got.numpy(), want, atol=bound, rtol=0)
    # Eager float32 PyTorch is within the same bound of float64, so the two
    # agree to twice that (their sin/cos implementations differ by ulps).
    eager = eager_get_timestep_embedding(torch, timesteps, num_channels, flip,
                                         shift, scale)
    torch.testing.assert_close(got, eager, atol=2 * bound, rtol=0)


def test_timesteps_module_keeps_the_device(client):
    torch = pytest.importorskip("torch")
    from temb.torch import Timesteps
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for the device round trip")
    module = Timesteps(320, True, 0, client=client)
    got = module(torch.tensor([1.0, 999.0], device="cuda"))
    assert got.device.type == "cuda" and got.dtype == torch.float32


def test_parity_with_diffusers(client):
    torch = pytest.importorskip("torch")
    embeddings = pytest.importorskip("diffusers.models.embeddings")
    from temb.torch import Timesteps
    timesteps = torch.linspace(0, 999, 50)
    for args in [(320, True, 0), (256, True, 1), (128, False, 1)]:
        ours = Timesteps(*args, client=client)(timesteps)
        theirs = embeddings.Timesteps(*args)(timesteps)
        torch.testing.assert_close(ours, theirs, atol=1e-5 + 5e-7 * 999, rtol=0)
        direct = embeddings.get_timestep_embedding(
            timesteps, args[0], flip_sin_to_cos=args[1],
            downscale_freq_shift=args[2])
        torch.testing.assert_close(ours, direct, atol=1e-5 + 5e-7 * 999, rtol=0)


# --- temb.torch: the custom op, patch(), copies, pickles, compile ----------

def test_timesteps_module_shapes_and_meta(client):
    torch = pytest.importorskip("torch")
    from temb.torch import Timesteps
    module = Timesteps(256, True, 0, client=client)
    t = torch.arange(14.0).reshape(2, 7) * 71
    got = module(t)
    assert got.shape == (2, 7, 256) and got.dtype == torch.float32
    assert torch.equal(got.reshape(14, 256), module(t.reshape(-1)))
    assert module(torch.tensor(5.0)).shape == (1, 256)
    # Meta tensors: a meta result of the right shape, and no call.
    meta = module(torch.empty(2, 7, device="meta"))
    assert meta.device.type == "meta" and meta.shape == (2, 7, 256)
    assert meta.dtype == torch.float32
    # bf16 timesteps are widened exactly (diffusers' timesteps.float()).
    t16 = torch.tensor([0.1, 500.5, 999.0]).to(torch.bfloat16)
    assert torch.equal(module(t16), module(t16.float()))


def test_the_op_is_registered_and_checked(client):
    torch = pytest.importorskip("torch")
    import temb.torch as ttorch
    module = ttorch.Timesteps(16, True, 0, client=client)
    op = torch.ops.temb.timestep_embedding.default
    args = (torch.tensor([1.0, 2.0]), module._client_key, 16, True, 0.0, 1.0,
            10000.0, "fp32", None)
    assert torch.equal(op(*args), module(torch.tensor([1.0, 2.0])))
    torch.library.opcheck(torch.ops.temb.timestep_embedding, args)


def _tiny_model(torch, embeddings):
    """Two Timesteps modules (PixArt's time and size projections), and the
    same module under a second name."""
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = embeddings.PixArtAlphaCombinedTimestepSizeEmbeddings(
                48, size_emb_dim=16, use_additional_conditions=True)
            self.alias = self.emb.time_proj
            self.unrelated = torch.nn.Linear(2, 2)

        def forward(self, t, resolution, aspect_ratio):
            return self.emb(t, resolution, aspect_ratio,
                            batch_size=t.shape[0], hidden_dtype=torch.float32)
    torch.manual_seed(0)
    return Tiny().eval()


def _inputs(torch):
    return (torch.tensor([999.0, 1.0]), torch.tensor([[1024.0, 768.0]] * 2),
            torch.tensor([[0.75]] * 2))


def test_patch_swaps_every_diffusers_timesteps(client):
    torch = pytest.importorskip("torch")
    embeddings = pytest.importorskip("diffusers.models.embeddings")
    import temb.torch as ttorch
    model = _tiny_model(torch, embeddings)
    with torch.no_grad():
        before = model(*_inputs(torch))
    replaced = ttorch.patch(model, client=client)
    assert sorted(replaced) == ["alias", "emb.additional_condition_proj",
                                "emb.time_proj"]
    assert isinstance(model.emb.time_proj, ttorch.Timesteps)
    assert model.alias is model.emb.time_proj  # one module stays one module
    assert (model.emb.additional_condition_proj.num_channels,
            model.emb.additional_condition_proj.flip_sin_to_cos,
            model.emb.additional_condition_proj.downscale_freq_shift) == (256, True, 0)
    assert not any(type(m) is embeddings.Timesteps for m in model.modules())
    assert ttorch.patch(model, client=client) == []  # idempotent
    with torch.no_grad():
        after = model(*_inputs(torch))
    # fp32 sinusoids agree to an ulp of the angle (|t| <= 1024 here); the
    # Linear layers behind them keep that scale.
    torch.testing.assert_close(after, before, atol=2e-4, rtol=0)
    with pytest.raises(ValueError, match="exactly one"):
        ttorch.patch(model)


def test_patch_maps_bria_time_theta_to_max_period(client):
    torch = pytest.importorskip("torch")
    bria = pytest.importorskip("diffusers.models.transformers.transformer_bria")
    import temb.torch as ttorch
    holder = torch.nn.Module()
    holder.proj = bria.BriaTimesteps(256, True, 0, time_theta=1000)
    t = torch.tensor([0.0, 1.0, 999.0])
    want = holder.proj(t)
    assert ttorch.patch(holder, client=client) == ["proj"]
    assert holder.proj.max_period == 1000.0
    torch.testing.assert_close(holder.proj(t), want, atol=1e-6 + 5e-7 * 999 * 2,
                               rtol=0)


def test_patch_leaves_other_sinusoid_classes_alone(client):
    """Only diffusers' own sinusoid modules are replaced: a subclass that
    computes otherwise, though it has their attributes, is not."""
    torch = pytest.importorskip("torch")
    embeddings = pytest.importorskip("diffusers.models.embeddings")
    import temb.torch as ttorch

    class Doubled(embeddings.Timesteps):
        def forward(self, timesteps):
            return 2 * super().forward(timesteps)

    holder = torch.nn.Module()
    holder.proj = Doubled(256, True, 0)
    holder.plain = embeddings.Timesteps(256, True, 0)
    assert ttorch.patch(holder, client=client) == ["plain"]
    assert type(holder.proj) is Doubled


def test_deepcopy_shares_the_connection(client):
    torch = pytest.importorskip("torch")
    embeddings = pytest.importorskip("diffusers.models.embeddings")
    import copy
    import temb.torch as ttorch
    model = _tiny_model(torch, embeddings)
    ttorch.patch(model, client=client)
    ema = copy.deepcopy(model)
    assert ema.emb.time_proj is not model.emb.time_proj
    assert ema.alias is ema.emb.time_proj
    assert ema.emb.time_proj.client is client
    with torch.no_grad():
        assert torch.equal(ema(*_inputs(torch)), model(*_inputs(torch)))


def test_pickle_carries_settings_not_the_connection(client, server, tmp_path):
    torch = pytest.importorskip("torch")
    embeddings = pytest.importorskip("diffusers.models.embeddings")
    import os
    import pickle
    import subprocess
    import sys
    import temb.torch as ttorch
    # A diffusers module (importable in another process), patched.
    model = _tiny_model(torch, embeddings).emb
    ttorch.patch(model, client=client)
    options = dict(batch_size=2, hidden_dtype=torch.float32)
    with torch.no_grad():
        want = model(*_inputs(torch), **options)
    data = pickle.dumps(model)
    same_process = pickle.loads(data)
    assert same_process.time_proj._client is None  # opened on first use
    with torch.no_grad():
        assert torch.equal(same_process(*_inputs(torch), **options), want)
    # Another process (as a multiprocessing worker): the module opens its
    # own client to the same target.
    (tmp_path / "model.pkl").write_bytes(data)
    torch.save((_inputs(torch), want), tmp_path / "io.pt")
    script = (
        "import pickle, sys, torch\n"
        "model = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "inputs, want = torch.load(sys.argv[2])\n"
        "with torch.no_grad():\n"
        "    got = model(*inputs, batch_size=2, hidden_dtype=torch.float32)\n"
        "assert torch.equal(got, want)\n"
        "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "model.pkl"),
         str(tmp_path / "io.pt")], capture_output=True, text=True, env=env,
        timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_a_client_with_unpicklable_credentials_is_refused_clearly(server):
    pytest.importorskip("torch")
    import grpc
    import pickle
    from temb.torch import Timesteps
    with temb.Client(server.target,
                     tls=grpc.local_channel_credentials()) as tls_client:
        module = Timesteps(8, True, 0, client=tls_client)
        with pytest.raises(TypeError, match="TlsConfig"):
            pickle.dumps(module)
        import copy
        assert copy.deepcopy(module).client is tls_client  # same process: fine
        module.close()  # a caller's client stays open and registered
        assert module.client is tls_client


def test_modules_need_a_blocking_client(server):
    pytest.importorskip("torch")
    from temb.torch import Timesteps
    aclient = temb.aio.Client.__new__(temb.aio.Client)  # never connected
    with pytest.raises(TypeError, match="blocking"):
        Timesteps(8, True, 0, client=aclient)
    with pytest.raises(ValueError, match="exactly one"):
        Timesteps(8, True, 0)


def test_target_modules_share_one_client_and_pickle(server):
    torch = pytest.importorskip("torch")
    import pickle
    from temb.torch import Timesteps
    a = Timesteps(64, True, 0, target=server.target)
    b = Timesteps(32, False, 1, target=server.target)
    assert a.client is b.client
    t = torch.tensor([3.0])
    want = a(t)
    restored = pickle.loads(pickle.dumps(a))
    assert torch.equal(restored(t), want)
    a.close()  # the shared client; the next call opens a new one
    assert torch.equal(b(t), b(t)) and torch.equal(a(t), want)


def test_torch_compile_fullgraph(client):
    torch = pytest.importorskip("torch")
    embeddings = pytest.importorskip("diffusers.models.embeddings")
    import temb.torch as ttorch
    model = _tiny_model(torch, embeddings)
    ttorch.patch(model, client=client)
    # aot_eager runs Dynamo (fullgraph: no graph break at the op) and the
    # fake-tensor propagation, without a C++ compiler run.
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert torch.equal(compiled(*_inputs(torch)), model(*_inputs(torch)))


def test_plain_calls_skip_the_op_and_dispatch_modes_see_it(client):
    """A plain eager call computes directly; under a Python dispatch mode
    (what make_fx and export install) the registered op is what runs, with
    the same numbers."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode
    import temb.torch as ttorch

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    module = ttorch.Timesteps(64, True, 0.0, client=client)
    t = torch.tensor([1.0, 500.0])
    assert ttorch._plain_eager_call(t)
    plain = module(t)
    with Record():
        assert not ttorch._plain_eager_call(t)
        watched = module(t)
    assert any("timestep_embedding" in name for name in seen), seen
    assert torch.equal(plain, watched)


def test_direct_calls_equal_the_op_and_follow_changes(client):
    """A plain eager call of 1-D float32 CPU timesteps on a client with the
    native transport skips embed()'s argument handling (its request head is
    built once); its numbers are the op's, every other input takes the
    general path, and the direct call is rebuilt after an attribute
    changes.  Errors keep their types."""
    torch = pytest.importorskip("torch")
    import temb.torch as ttorch

    def op(timesteps, dim, scale=1.0):
        return ttorch.timestep_embedding(timesteps, module._client_key, dim,
                                         True, 0.0, scale, 10000.0, "fp32",
                                         None)

    module = ttorch.Timesteps(64, True, 0.0, client=client)
    t = torch.tensor([1.0, 500.0, 999.0])
    want = op(t, 64)
    assert torch.equal(module(t), want)
    assert (module._direct[2] is not None) == (client.transport == "native")
    # The general path: a scalar, 2-D, bf16 and strided timesteps.
    assert torch.equal(module(torch.tensor(500.0)), want[1:2])
    assert torch.equal(module(t.reshape(3, 1)), want.reshape(3, 1, 64))
    half = t.to(torch.bfloat16)
    assert torch.equal(module(half), op(half.float(), 64))
    strided = torch.tensor([1.0, -1.0, 500.0, -1.0, 999.0, -1.0])[::2]
    assert not strided.is_contiguous()
    assert torch.equal(module(strided), want)
    # Attributes set after the first call take effect.
    module.num_channels = 32
    assert torch.equal(module(t), op(t, 32))
    module.scale = 2.0
    assert torch.equal(module(t), op(t, 32, scale=2.0))
    module.num_channels = 0
    with pytest.raises(temb.InvalidArgumentError, match="dim"):
        module(t)
