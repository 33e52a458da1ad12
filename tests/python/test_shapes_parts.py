"""Shaped timesteps ([B, L] -> [B, L, dim]), timestep_dtype, several named
embeddings per call (parts) and frequency tables, through both clients and
streams."""

import asyncio
import math

import numpy as np
import pytest

import temb

LDM = dict(flip_sin_to_cos=True, downscale_freq_shift=0.0)


# --- shaped timesteps --------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 7), (3, 1), (1, 2, 3), (2, 1, 3, 1, 1),
                                   (2, 0)])
def test_shaped_timesteps_give_shape_plus_dim(client, shape):
    t = np.arange(math.prod(shape), dtype=np.float32).reshape(shape) * 37.5
    got = client.embed(t, preset="sdxl")
    assert got.shape == shape + (320,)
    flat = client.embed(t.reshape(-1), preset="sdxl")
    np.testing.assert_array_equal(got.reshape(-1, 320), flat)


def test_shaped_timesteps_of_every_input_kind(client):
    torch = pytest.importorskip("torch")
    want = client.embed(np.arange(14).reshape(2, 7), preset="dit")  # integers
    assert want.shape == (2, 7, 256)
    for t in (np.arange(14).reshape(2, 7).tolist(),
              np.arange(14, dtype=np.float64).reshape(2, 7),
              torch.arange(14).reshape(2, 7),
              torch.arange(14, dtype=torch.bfloat16).reshape(2, 7),
              torch.arange(14.0).reshape(2, 7).t().contiguous().t()):  # strided
        got = client.embed(t, preset="dit")
        np.testing.assert_array_equal(got, want)
    pt = client.embed(torch.zeros(2, 7), preset="dit", return_tensors="pt",
                      dtype=torch.bfloat16)
    assert pt.shape == (2, 7, 256) and pt.dtype == torch.bfloat16


def test_scalar_and_1d_shapes_are_unchanged(client):
    assert client.embed(3.0, preset="dit").shape == (1, 256)
    assert client.embed([3.0], preset="dit").shape == (1, 256)
    assert client.embed([], preset="dit").shape == (0, 256)


def test_rank_above_5_is_refused_before_sending(client):
    with pytest.raises(ValueError, match="at most 5 dimensions"):
        client.embed(np.zeros((1,) * 6), preset="dit")


# --- timestep_dtype ----------------------------------------------------------

def _pipeline_t(torch, t, dtype, time_factor):
    """What diffusers' Flux does: timestep.to(dtype) * time_factor, widened."""
    return (torch.tensor(t, dtype=torch.float32).to(dtype) * time_factor).float()


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_timestep_dtype_rounds_t_and_applies_time_factor_in_it(client, name):
    torch = pytest.importorskip("torch")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[name]
    t = [0.0, 0.001, 0.1234, 0.5, 0.7777, 0.999, 1.0]
    got = client.embed(t, preset="flux", timestep_dtype=name)
    # The same numbers from the explicit convention without time_factor,
    # fed what the pipeline's model feeds its sinusoid.
    want = client.embed(_pipeline_t(torch, t, dtype, 1000).numpy(), dim=256, **LDM)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, client.embed(t, preset="flux"))
    # torch and numpy dtypes name the same thing.
    np.testing.assert_array_equal(
        client.embed(t, preset="flux", timestep_dtype=dtype), got)
    if name == "fp16":
        np.testing.assert_array_equal(
            client.embed(t, preset="flux", timestep_dtype=np.float16), got)


def test_timestep_dtype_with_an_explicit_spec(client):
    torch = pytest.importorskip("torch")
    t = [0.3, 0.6]
    got = client.embed(t, dim=64, time_factor=1000.0, timestep_dtype="bf16", **LDM)
    want = client.embed(_pipeline_t(torch, t, torch.bfloat16, 1000).numpy(),
                        dim=64, **LDM)
    np.testing.assert_array_equal(got, want)
    fp32 = client.embed(t, dim=64, time_factor=1000.0, timestep_dtype="fp32", **LDM)
    np.testing.assert_array_equal(
        fp32, client.embed(t, dim=64, time_factor=1000.0, **LDM))


def test_timestep_dtype_fp64_and_junk_are_refused(client):
    with pytest.raises(temb.InvalidArgumentError, match="timestep_dtype"):
        client.embed([0.5], preset="flux", timestep_dtype="fp64")
    with pytest.raises(ValueError, match="timestep_dtype"):
        client.embed([0.5], preset="flux", timestep_dtype="int8")


# --- parts -------------------------------------------------------------------

def test_flux_timestep_and_guidance_in_one_call(client):
    t, g = [0.25, 1.0], [3.5, 3.5]
    got = client.embed_parts({"timestep": t, "guidance": g}, preset="flux")
    assert list(got) == ["timestep", "guidance"]
    np.testing.assert_array_equal(got["timestep"], client.embed(t, preset="flux"))
    np.testing.assert_array_equal(got["guidance"], client.embed(g, preset="flux"))
    # embed(parts=...) is the same call.
    same = client.embed(preset="flux", parts={"timestep": t, "guidance": g})
    assert same.keys() == got.keys()
    for name in got:
        np.testing.assert_array_equal(same[name], got[name])


def test_parts_take_the_presets_part_conventions(client, info):
    assert info.preset("sdxl").parts == (("time", "sdxl"),
                                         ("add_time", "sdxl-add-time"))
    ids = np.array([[1024, 1024, 0, 0, 1024, 1024]] * 2)
    got = client.embed_parts({"time": [999, 999], "add_time": ids},
                             preset="sdxl", dtype="fp16")
    assert got["time"].shape == (2, 320) and got["time"].dtype == np.float16
    assert got["add_time"].shape == (2, 6, 256)
    np.testing.assert_array_equal(
        got["add_time"], client.embed(ids, preset="sdxl-add-time", dtype="fp16"))


def test_part_options(client):
    torch = pytest.importorskip("torch")
    got = client.embed_parts({
        "t": {"timesteps": [0.5], "timestep_dtype": "bf16"},
        "g": {"timesteps": [[4.0]], "dtype": "bf16"},
        "other": {"timesteps": [1.0], "preset": "sdxl"},
        "explicit": {"timesteps": [2.0], "dim": 8, **LDM},
    }, preset="flux", return_tensors="pt")
    assert got["t"].shape == (1, 256) and got["t"].dtype == torch.float32
    assert torch.equal(got["t"], client.embed([0.5], preset="flux",
                                              timestep_dtype="bf16",
                                              return_tensors="pt"))
    assert got["g"].shape == (1, 1, 256) and got["g"].dtype == torch.bfloat16
    assert got["other"].shape == (1, 320)
    assert got["explicit"].shape == (1, 8)


def test_request_level_options_reach_the_parts(client):
    got = client.embed_parts({"timestep": [0.5], "guidance": [0.5]},
                             preset="flux", timestep_dtype="bf16", dtype="fp16")
    want = client.embed([0.5], preset="flux", timestep_dtype="bf16", dtype="fp16")
    for tensor in got.values():
        np.testing.assert_array_equal(tensor, want)


def test_a_part_name_the_preset_lacks_uses_the_preset_itself(client):
    got = client.embed_parts({"anything": [7.0]}, preset="dit")
    np.testing.assert_array_equal(got["anything"], client.embed([7.0], preset="dit"))


def test_a_bad_part_is_named_in_the_error(client):
    with pytest.raises(temb.InvalidArgumentError) as e:
        client.embed_parts({"fine": [1.0], "broken": {"timesteps": [1.0], "dim": 0,
                                                      **LDM}}, preset="dit")
    assert "broken" in e.value.details
    with pytest.raises(temb.NotFoundError):
        client.embed_parts({"x": {"timesteps": [1.0], "preset": "no-such-model"}})


def test_part_arguments_are_checked_before_sending(client):
    with pytest.raises(TypeError, match="either timesteps or parts"):
        client.embed([1.0], preset="flux", parts={"timestep": [1.0]})
    with pytest.raises(TypeError, match="needs timesteps"):
        client.embed(preset="flux")
    with pytest.raises(ValueError, match="empty"):
        client.embed_parts({}, preset="flux")
    with pytest.raises(TypeError, match="unknown keys"):
        client.embed_parts({"t": {"timesteps": [1.0], "flip": True}}, preset="flux")
    with pytest.raises(TypeError, match="no timesteps"):
        client.embed_parts({"t": {"dim": 8}}, preset="flux")
    with pytest.raises(TypeError, match="mapping"):
        client.embed_parts([("t", [1.0])], preset="flux")


def test_parts_in_a_stream(client):
    results = list(client.embed_stream([
        dict(parts={"timestep": [0.5], "guidance": [3.5]}, preset="flux"),
        dict(timesteps=np.zeros((2, 3)), preset="dit"),
        dict(parts={"x": {"timesteps": [1.0], "preset": "no-such-model"}}),
    ], raise_errors=False))
    assert set(results[0]) == {"timestep", "guidance"}
    np.testing.assert_array_equal(results[0]["guidance"],
                                  client.embed([3.5], preset="flux"))
    assert results[1].shape == (2, 3, 256)
    assert isinstance(results[2], temb.NotFoundError)


def test_asyncio_client_shapes_and_parts(server, client):
    want = client.embed_parts({"timestep": [0.5], "guidance": [3.5]},
                              preset="flux", timestep_dtype="bf16")

    async def main():
        async with temb.aio.Client(server.target, timeout=60) as aclient:
            got = await aclient.embed_parts({"timestep": [0.5], "guidance": [3.5]},
                                            preset="flux", timestep_dtype="bf16")
            for name in want:
                np.testing.assert_array_equal(got[name], want[name])
            shaped = await aclient.embed(np.zeros((2, 7)), preset="flux")
            assert shaped.shape == (2, 7, 256)
            same = await aclient.embed(preset="flux", parts={"timestep": [0.5]},
                                       timestep_dtype="bf16")
            np.testing.assert_array_equal(same["timestep"], want["timestep"])

    asyncio.run(main())


def test_embed_parts_signature_is_visible():
    import inspect
    parameters = inspect.signature(temb.Client.embed_parts).parameters
    assert list(parameters)[:4] == ["self", "parts", "preset", "dtype"]
    assert "timestep_dtype" in parameters
    assert "timestep_dtype" in inspect.signature(temb.Client.embed).parameters
    assert "parts" in inspect.signature(temb.aio.Client.embed).parameters


# --- frequency tables --------------------------------------------------------

def test_explicit_frequencies(client):
    t = np.float32([0.0, 0.5, 3.0])
    freqs = [1.0, 0.25, 2.0, 1e-3]
    got = client.embed(t, dim=8, flip_sin_to_cos=True, frequencies=freqs,
                       precision="fp64", dtype="fp64")
    angles = t.astype(np.float64)[:, None] * np.float64(freqs)[None, :]
    np.testing.assert_allclose(got, np.concatenate([np.cos(angles),
                                                    np.sin(angles)], 1),
                               atol=1e-12)
    np.testing.assert_array_equal(
        client.embed(t, dim=8, flip_sin_to_cos=True,
                     frequencies=np.float64(freqs)),
        client.embed(t, dim=8, flip_sin_to_cos=True, frequencies=tuple(freqs)))


def test_log_spaced_frequencies_are_the_stable_audio_3_preset(client, info):
    if info.preset("stable-audio-3") is None:
        pytest.skip("the server has no stable-audio-3 preset")
    t = [0.0, 0.25, 1.0]
    got = client.embed(t, dim=256, flip_sin_to_cos=True,
                       log_spaced_frequencies=(0.5, 10000.0), scale=2 * math.pi)
    np.testing.assert_array_equal(got, client.embed(t, preset="stable-audio-3"))
    # The server reports the table it generated: ascending, 0.5 to 10000.
    table = info.preset("stable-audio-3").spec.frequencies
    assert len(table) == 128 and list(table) == sorted(table)
    np.testing.assert_allclose([table[0], table[-1]], [0.5, 1e4], rtol=1e-6)
