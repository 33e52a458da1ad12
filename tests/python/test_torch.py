"""temb.torch.Timesteps and return_tensors="pt" (skipped without PyTorch);
parity with diffusers where it is installed."""

import importlib
import math

import numpy as np
import pytest

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
