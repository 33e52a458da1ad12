"""The Python client returns exactly what `temb embed --local --format=json`
prints: the same numbers through the server as through the in-process CLI."""

import json
import subprocess

import numpy as np
import pytest

import temb_reference as reference

TIMESTEPS = np.array([0.0, 1.0, 0.5, 10.5, 999.0, 500.25, -3.0, 1234.5],
                     dtype=np.float32)

CASES = {
    "sdxl": dict(preset="sdxl"),
    "flux": dict(preset="flux"),
    "ddpm-odd": dict(dim=37, flip_sin_to_cos=False, downscale_freq_shift=1.0),
    "options": dict(dim=64, flip_sin_to_cos=True, downscale_freq_shift=0.0,
                    max_period=1000.0, scale=2.0, time_factor=3.0),
    "interleaved": dict(dim=16, flip_sin_to_cos=False, downscale_freq_shift=0.0,
                        layout="interleaved"),
    "fp64-precision": dict(dim=32, flip_sin_to_cos=True, downscale_freq_shift=0.0,
                           precision="fp64"),
    "slope-first": dict(dim=256, flip_sin_to_cos=False, downscale_freq_shift=1.0,
                        time_factor=1000.0, exponent_order="slope_first"),
    "longcat": dict(preset="longcat-audio-dit"),
}


def cli_flags(options):
    flags = []
    for name, value in options.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        flags.append(f"--{name}={value}")
    return flags


def run_cli(cli_binary, options, dtype):
    timesteps = ",".join(repr(float(t)) for t in TIMESTEPS)  # exact float32
    command = [str(cli_binary), "embed", "--local", f"--timesteps={timesteps}",
               f"--dtype={dtype}", "--format=json", *cli_flags(options)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{command} failed:\n{done.stderr}"
    # parse_int=float keeps the sign of a printed "-0".
    return json.loads(done.stdout, parse_int=float)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_client_equals_cli_local(client, cli_binary, case, dtype):
    options = CASES[case]
    printed = run_cli(cli_binary, options, dtype)
    assert printed["dtype"] == dtype
    values = np.array(printed["data"], dtype=np.float64).reshape(
        [int(n) for n in printed["shape"]])

    if dtype == "bf16":
        got = client.embed(TIMESTEPS, dtype=dtype, bf16_format="bits", **options)
        want_bits = reference.to_bf16_bits(values.astype(np.float32))
        # The decimals printed for bf16 are exact: re-rounding must be a no-op.
        np.testing.assert_array_equal(
            reference.bf16_bits_to_float32(want_bits), values.astype(np.float32))
        np.testing.assert_array_equal(got, want_bits)
    else:
        got = client.embed(TIMESTEPS, dtype=dtype, **options)
        want = values.astype(got.dtype)  # %.9g and exact decimals round-trip
        assert got.shape == values.shape
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
