"""`temb embed --target` (the real server) prints exactly what `temb embed
--local` (the service core in-process) prints, byte for byte."""
import json

import numpy as np
import pytest

from conftest import temb

TIMESTEPS = "0,1,2.5,-3,17,250.25,999,1000,4242.5"

# (id, spec flags): presets and explicit conventions, odd and even widths.
SPECS = [
    ("sd15", ["--preset=sd15"]),
    ("ddpm", ["--preset=ddpm"]),
    ("flux", ["--preset=flux"]),
    ("wan-fp64", ["--preset=wan"]),
    ("dit-diffusers", ["--preset=dit-diffusers"]),
    ("transformer-64", ["--preset=transformer", "--dim=64"]),
    ("ldm-odd", ["--dim=33", "--flip_sin_to_cos", "--downscale_freq_shift=0"]),
    ("diffusers-defaults", ["--dim=7", "--noflip_sin_to_cos",
                            "--downscale_freq_shift=1"]),
    ("scaled", ["--dim=16", "--flip_sin_to_cos", "--downscale_freq_shift=0",
                "--max_period=100", "--scale=3.5", "--time_factor=0.5"]),
    ("interleaved", ["--dim=12", "--noflip_sin_to_cos",
                     "--downscale_freq_shift=0", "--layout=interleaved"]),
    ("repeat-only", ["--dim=5", "--flip_sin_to_cos", "--downscale_freq_shift=0",
                     "--repeat_only"]),
    ("fp64-precision", ["--dim=20", "--flip_sin_to_cos",
                        "--downscale_freq_shift=0", "--precision=fp64"]),
]
DTYPES = ["fp32", "fp16", "bf16"]
NPY_DESCR = {"fp32": "<f4", "fp16": "<f2", "bf16": "<u2", "fp64": "<f8"}


def embed(target_flags, spec, dtype, fmt):
    result = temb("embed", *target_flags, *spec, f"--dtype={dtype}",
                  f"--timesteps={TIMESTEPS}", f"--format={fmt}")
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b""
    return result.stdout


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", [s for _, s in SPECS], ids=[i for i, _ in SPECS])
def test_remote_equals_local(server, spec, dtype):
    remote = ["--target", server.target]
    for fmt in ("json", "npy"):
        assert embed(remote, spec, dtype, fmt) == embed(["--local"], spec,
                                                        dtype, fmt), fmt


@pytest.mark.parametrize("dtype", DTYPES + ["fp64"])
def test_json_and_npy_agree(server, tmp_path, dtype):
    remote = ["--target", server.target]
    spec = ["--dim=33", "--flip_sin_to_cos", "--downscale_freq_shift=0"]
    doc = json.loads(embed(remote, spec, dtype, "json"))
    n = len(TIMESTEPS.split(","))
    assert doc["shape"] == [n, 33] and doc["dtype"] == dtype
    path = tmp_path / "e.npy"
    path.write_bytes(embed(remote, spec, dtype, "npy"))
    array = np.load(path)
    assert array.dtype.str == NPY_DESCR[dtype] and array.shape == (n, 33)
    if dtype == "bf16":  # raw bfloat16 bits, widened exactly
        array = (array.astype(np.uint32) << 16).view(np.float32)
    values = np.asarray(doc["data"], dtype=np.float64).reshape(n, 33)
    # The JSON decimals convert back to exactly the stored elements (fp32
    # decimals after rounding to float32; fp16/bf16 ones are exact).
    exact = values.astype(np.float32) if dtype == "fp32" else values
    np.testing.assert_array_equal(exact, array.astype(exact.dtype))
    assert np.all(values[:, 32] == 0)  # odd width: last column exactly 0
    np.testing.assert_array_equal(values[0, :16], 1.0)  # t = 0: cos 0
    np.testing.assert_array_equal(values[0, 16:32], 0.0)


def test_golden_row(server):
    doc = json.loads(embed(["--target", server.target],
                           ["--dim=8", "--flip_sin_to_cos",
                            "--downscale_freq_shift=0"], "fp32", "json"))
    row = np.asarray(doc["data"][8:16])  # t = 1
    golden = [0.540302306, 0.995004165, 0.99995, 0.9999995, 0.841470985,
              0.0998334166, 0.00999983333, 0.000999999833]
    np.testing.assert_allclose(row, golden, rtol=0, atol=2e-7)


def test_timesteps_file(server, tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(TIMESTEPS.replace(",", "\n  ") + "\n")
    from_file = temb("embed", "--target", server.target, "--preset=sdxl",
                     f"--timesteps=@{path}")
    inline = temb("embed", "--target", server.target, "--preset=sdxl",
                  f"--timesteps={TIMESTEPS}")
    assert from_file.returncode == 0 and from_file.stdout == inline.stdout


def test_empty_batch(server):
    result = temb("embed", "--target", server.target, "--preset=sd15",
                  "--timesteps=")
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout) == {"shape": [0, 320], "dtype": "fp32",
                                         "data": []}


def test_table_format(server):
    result = temb("embed", "--target", server.target, "--preset=ddpm",
                  "--timesteps=1,2", "--format=table")
    lines = result.stdout.decode().splitlines()
    assert result.returncode == 0 and lines[0].startswith("# shape [2, 128]")
    assert len(lines) == 3
    # t=..., first 4 columns, "...", last 4 columns
    assert lines[1].split()[5] == "..." and len(lines[1].split()) == 1 + 4 + 1 + 4


def test_health_and_info(server):
    health = temb("health", "--target", server.target)
    assert health.returncode == 0 and health.stdout.strip() == b"SERVING"
    info = temb("info", "--target", server.target)
    text = info.stdout.decode()
    assert info.returncode == 0
    for needle in ("version:", "backend:", "max_dim=16384", "sdxl", "flux"):
        assert needle in text


def test_round_robin_target_list(start_server):
    a, b = start_server(), start_server()
    target = f"ipv4:127.0.0.1:{a.port},127.0.0.1:{b.port}"
    result = temb("bench", "--target", target, "--requests=200",
                  "--concurrency=4", "--warmup=0s", "--channels=2", "--json")
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout)["requests"] == 200
    b.kill()  # the survivor answers everything (retries cover the gap)
    result = temb("bench", "--target", target, "--requests=100",
                  "--concurrency=4", "--warmup=0s", "--json")
    assert result.returncode == 0, result.stderr.decode()


def run_json(*args):
    result = temb("embed", *args, "--format=json")
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def test_pipeline_dtype_timesteps_remote_equals_local(server):
    # A bf16 Flux pipeline: sigma 0.8929 reaches the embedding as 896.
    flags = ["--preset=flux", "--timesteps=0.8929,0.5,1",
             "--timestep_dtype=bf16", "--dtype=bf16"]
    remote = run_json("--target", server.target, *flags)
    assert remote == run_json("--local", *flags)
    as_896 = run_json("--local", "--dim=256", "--flip_sin_to_cos",
                      "--downscale_freq_shift=0", "--timesteps=896",
                      "--dtype=bf16")
    assert remote["data"][:256] == as_896["data"]


def test_shaped_timesteps_give_shape_plus_dim(server):
    flags = ["--preset=wan-diffusers", "--timesteps=" + ",".join(
        str(7 * i) for i in range(14)), "--timesteps_shape=2,7"]
    remote = run_json("--target", server.target, *flags)
    assert remote["shape"] == [2, 7, 256]
    assert remote == run_json("--local", *flags)
    flat = run_json("--local", *flags[:2])
    assert flat["shape"] == [14, 256] and flat["data"] == remote["data"]
    bad = temb("embed", "--target", server.target, "--preset=sd15",
               "--timesteps=1,2,3", "--timesteps_shape=2,2")
    assert bad.returncode == 1
    assert b"timesteps_shape [2, 2] does not match" in bad.stderr


def test_flux_timestep_and_guidance_in_one_call(server):
    flags = ["--preset=flux", "--part=timestep:0.25,1",
             "--part=guidance:3.5,3.5"]
    remote = run_json("--target", server.target, *flags)
    assert list(remote["parts"]) == ["timestep", "guidance"]
    assert remote == run_json("--local", *flags)
    alone = run_json("--local", "--preset=flux", "--timesteps=3.5,3.5")
    assert remote["parts"]["guidance"] == alone
