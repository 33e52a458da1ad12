"""Frequency tables instead of the exp formula, against diffusers' own
modules: Stable Audio Open's learned Gaussian Fourier weights loaded from a
.npy or .safetensors file named in a --presets_file, and Stable Audio 3's
log-spaced table (the built-in stable-audio-3 preset)."""
import json

import numpy as np
import pytest
import torch
from diffusers.models.transformers.stable_audio_transformer import (
    StableAudioGaussianFourierProjection)
from diffusers.models.transformers.transformer_stable_audio3 import (
    StableAudio3ExpoFourierFeatures)
from safetensors.numpy import save_file

import subprocess

from conftest import SERVER, temb

FLOAT32_EPS = 2.0 ** -23


def embed_json(*flags):
    result = temb("embed", *flags, "--format=json")
    assert result.returncode == 0, result.stderr.decode()
    doc = json.loads(result.stdout)
    return np.array(doc["data"], np.float32).reshape(doc["shape"])


def stable_audio_open_projection():
    torch.manual_seed(1234)
    # As StableAudioDiTModel builds its time_proj; W stands for a checkpoint.
    return StableAudioGaussianFourierProjection(
        embedding_size=128, flip_sin_to_cos=True, log=False,
        set_W_to_weight=False)


@pytest.mark.parametrize("file_format", ["npy", "safetensors"])
def test_stable_audio_open_table_from_a_file(start_server, tmp_path,
                                             file_format):
    projection = stable_audio_open_projection()
    weights = projection.weight.detach().numpy().astype(np.float32)
    if file_format == "npy":
        np.save(tmp_path / "time_proj.npy", weights)
        table = 'frequencies_file: "time_proj.npy"'
    else:
        save_file({"transformer.time_proj.weight": weights, "other": weights[:4]},
                  str(tmp_path / "time_proj.safetensors"))
        table = ('frequencies_file: "time_proj.safetensors" '
                 'frequencies_tensor: "transformer.time_proj.weight"')
    # 2*pi*t*W: time_factor 2*pi rounds 2*pi*t in float32 first, as
    # `2 * np.pi * x` does, then the product with each weight.
    (tmp_path / "presets.textproto").write_text(
        'presets { name: "stable-audio-open" description: "Source: test" '
        'spec { dim: 256 flip_sin_to_cos: true '
        'time_factor: 6.283185307179586 } ' + table + ' }\n')
    server = start_server(f"--presets_file={tmp_path / 'presets.textproto'}")
    timesteps = np.array([0.0, 0.05, 0.3, 0.5, 0.77, 1.0], np.float32)
    got = embed_json("--target", server.target, "--preset=stable-audio-open",
                     "--timesteps=" + ",".join(map(str, timesteps)))
    want = projection(torch.from_numpy(timesteps)).detach().numpy()
    assert got.shape == want.shape == (6, 256)
    # Same angles to the bit; sin/cos within an ulp of torch's.
    assert np.max(np.abs(got - want)) <= 2 * FLOAT32_EPS
    assert np.mean(got == want) >= 0.9


def test_frequency_file_errors_name_the_file(tmp_path):
    (tmp_path / "presets.textproto").write_text(
        'presets { name: "x" description: "Source: test" spec { dim: 8 '
        'flip_sin_to_cos: true } frequencies_file: "missing.npy" }\n')
    np.save(tmp_path / "short.npy", np.ones(3, np.float32))
    (tmp_path / "short.textproto").write_text(
        'presets { name: "x" description: "Source: test" spec { dim: 8 '
        'flip_sin_to_cos: true } frequencies_file: "short.npy" }\n')
    for catalogue, message in (("presets.textproto", "missing.npy"),
                               ("short.textproto",
                                "frequencies must hold dim / 2 = 4 values, "
                                "got 3")):
        started = subprocess.run(
            [str(SERVER), "--address=127.0.0.1:0", "--metrics_address=",
             f"--presets_file={tmp_path / catalogue}"],
            capture_output=True, timeout=30)
        assert started.returncode != 0
        assert message in started.stderr.decode(), started.stderr.decode()


def test_stable_audio_3_log_spaced_table(server):
    timesteps = np.array([0.0, 0.001, 0.25, 0.5, 0.999, 1.0], np.float32)
    flags = ["--preset=stable-audio-3",
             "--timesteps=" + ",".join(map(str, timesteps))]
    got = embed_json("--target", server.target, *flags)
    assert np.array_equal(got, embed_json("--local", *flags))
    want = StableAudio3ExpoFourierFeatures(256)(
        torch.from_numpy(timesteps)[:, None]).numpy()
    # Angles reach 2*pi*1e4*t.  torch's float32 linspace and exp round a few
    # of the 128 frequencies one ulp differently from temb's (and from one
    # CPU to another: its vectorised linspace), which moves sin/cos by up to
    # about an ulp of the angle: the tolerance is 2 ulps of the largest
    # angle of each row.
    largest_angle = 2 * np.pi * 1e4 * np.abs(timesteps)[:, None]
    assert np.all(np.abs(got - want) <= 2 * FLOAT32_EPS * largest_angle + 1e-6)
    assert np.mean(got == want) >= 0.8
