"""temb.Client.embed against a real server: conventions, dtypes, presets,
inputs and limits."""

import numpy as np
import pytest

import temb_reference as reference
import temb

TIMESTEPS = [0.0, 1.0, 0.5, 10.5, 999.0, 500.25, -3.0, 1234.5]
# The conventions of the guide's table: (flip_sin_to_cos, downscale_freq_shift).
LDM = dict(flip_sin_to_cos=True, downscale_freq_shift=0.0)
DDPM = dict(flip_sin_to_cos=False, downscale_freq_shift=1.0)


def assert_within_fp32_bound(got, want, timesteps, scale=1.0, time_factor=1.0):
    assert got.dtype == np.float32
    assert got.shape == want.shape
    error = np.abs(got.astype(np.float64) - want)
    bound = reference.fp32_bound(timesteps, scale, time_factor)
    worst = np.unravel_index(np.argmax(error - bound), error.shape)
    assert np.all(error <= bound), (
        f"error {error[worst]:.3g} > bound {bound[worst[0], 0]:.3g} at {worst}")


# --- the spec options ------------------------------------------------------

@pytest.mark.parametrize("dim, convention", [
    (dim, convention) for dim in (1, 2, 3, 7, 8, 128, 320, 1025)
    for convention in (LDM, DDPM)
    if dim // 2 != convention["downscale_freq_shift"]  # H - shift == 0: error
], ids=lambda v: "ldm" if v is LDM else "ddpm" if v is DDPM else str(v))
def test_fp32_matches_float64_reference(client, dim, convention):
    got = client.embed(TIMESTEPS, dim=dim, **convention)
    want = reference.embedding(TIMESTEPS, dim, **convention)
    assert_within_fp32_bound(got, want, TIMESTEPS)


def test_guide_golden_rows(client):
    ldm = client.embed([1.0, 999.0], dim=8, **LDM)
    np.testing.assert_allclose(ldm[0], [
        0.540302306, 0.995004165, 0.99995, 0.9999995, 0.841470985,
        0.0998334166, 0.00999983333, 0.000999999833], atol=2e-6)
    np.testing.assert_allclose(ldm[1], [
        0.999649853, 0.807458658, -0.844469696, 0.541143507, -0.0264607527,
        -0.589924161, -0.535603335, 0.840930262], atol=2e-6 + 5e-7 * 999)
    ddpm = client.embed([10.5], dim=7, **DDPM)
    np.testing.assert_allclose(ddpm[0], [
        -0.87969576, 0.104807169, 0.00104999981, -0.475536928, 0.994492563,
        0.999999449, 0], atol=2e-6)
    pe = client.embed([2.0], dim=4, max_period=100.0, layout="interleaved",
                      flip_sin_to_cos=False, downscale_freq_shift=0.0)
    np.testing.assert_allclose(
        pe[0], [0.909297427, -0.416146837, 0.198669331, 0.980066578], atol=2e-6)


@pytest.mark.parametrize("options", [
    dict(max_period=100.0),
    dict(max_period=1e6),
    dict(scale=0.5),
    dict(scale=1000.0),
    dict(time_factor=1000.0),
    dict(layout="halves"),
    dict(layout="interleaved"),
    dict(flip_sin_to_cos=False),
    dict(downscale_freq_shift=0.5),
    dict(precision="fp32"),
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_spec_option(client, options):
    spec = dict(LDM, **options)
    spec.pop("precision", None)
    t = [0.0, 0.1, 1.0, 2.5, 999.0]
    got = client.embed(t, dim=64, **dict(LDM, **options))
    want = reference.embedding(t, 64, **spec)
    assert_within_fp32_bound(got, want, t, spec.get("scale", 1.0),
                             spec.get("time_factor", 1.0))


def test_repeat_only_copies_the_timestep(client):
    t = [0.0, 1.5, -7.25, 999.0]
    got = client.embed(t, dim=5, repeat_only=True, **LDM)
    np.testing.assert_array_equal(got, np.repeat(np.float32(t)[:, None], 5, 1))


def test_time_factor_differs_from_scale_only_in_rounding(client):
    t = [0.25, 0.5, 0.999]
    by_factor = client.embed(t, dim=256, time_factor=1000.0, **LDM)
    by_scale = client.embed(t, dim=256, scale=1000.0, **LDM)
    want = reference.embedding(t, 256, time_factor=1000.0, **LDM)
    assert_within_fp32_bound(by_factor, want, t, time_factor=1000.0)
    assert_within_fp32_bound(by_scale, want, t, scale=1000.0)


def test_equivalences_between_conventions(client):
    t = [0.0, 3.0, 999.0]
    halves = client.embed(t, dim=16, flip_sin_to_cos=False,
                          downscale_freq_shift=0.0)
    pe = client.embed(t, dim=16, flip_sin_to_cos=False,
                      downscale_freq_shift=0.0, layout="interleaved")
    interleaved = np.empty_like(halves)
    interleaved[:, 0::2], interleaved[:, 1::2] = halves[:, :8], halves[:, 8:]
    np.testing.assert_array_equal(pe, interleaved)
    flipped = client.embed(t, dim=16, **LDM)
    np.testing.assert_array_equal(flipped, np.concatenate(
        [halves[:, 8:], halves[:, :8]], axis=1))


def test_fp64_precision_is_closer_to_float64(client):
    t = [0.0, 1.0, 999.0, 12345.0]
    got = client.embed(t, dim=64, precision="fp64", dtype="fp64", **LDM)
    assert got.dtype == np.float64
    want = reference.embedding(t, 64, **LDM)
    angles = np.abs(np.float64(t))[:, None]
    assert np.all(np.abs(got - want) <= 1e-12 + 1e-14 * angles)


def test_edge_cases(client):
    zero = client.embed([0.0], dim=9, **LDM)
    np.testing.assert_array_equal(zero, [[1, 1, 1, 1, 0, 0, 0, 0, 0]])
    one = client.embed([5.0, 7.0], dim=1, **DDPM)
    np.testing.assert_array_equal(one, np.zeros((2, 1), np.float32))
    empty = client.embed([], dim=12, **LDM)
    assert empty.shape == (0, 12) and empty.dtype == np.float32


# --- output dtypes ---------------------------------------------------------

def test_fp16_is_the_rounded_fp32_result(client):
    t = np.linspace(-50, 1000, 97, dtype=np.float32)
    fp32 = client.embed(t, dim=320, **LDM)
    fp16 = client.embed(t, dim=320, dtype="fp16", **LDM)
    assert fp16.dtype == np.float16
    np.testing.assert_array_equal(fp16.view(np.uint16),
                                  fp32.astype(np.float16).view(np.uint16))


def test_bf16_is_the_rounded_fp32_result(client):
    t = np.linspace(-50, 1000, 97, dtype=np.float32)
    fp32 = client.embed(t, dim=320, **LDM)
    bits = client.embed(t, dim=320, dtype="bf16", bf16_format="bits", **LDM)
    assert bits.dtype == np.uint16 and bits.shape == (97, 320)
    np.testing.assert_array_equal(bits, reference.to_bf16_bits(fp32))
    widened = client.embed(t, dim=320, dtype="bf16", bf16_format="float32", **LDM)
    assert widened.dtype == np.float32
    np.testing.assert_array_equal(widened, reference.bf16_bits_to_float32(bits))


def test_bf16_as_ml_dtypes(client):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    t = [0.0, 1.0, 999.0]
    fp32 = client.embed(t, dim=64, **LDM)
    got = client.embed(t, dim=64, dtype="bf16", **LDM)  # "auto"
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16),
                                  fp32.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_fp64_output_widens_the_fp32_result(client):
    t = [0.5, 999.0]
    fp32 = client.embed(t, dim=32, **LDM)
    fp64 = client.embed(t, dim=32, dtype="fp64", **LDM)
    assert fp64.dtype == np.float64
    np.testing.assert_array_equal(fp64, fp32.astype(np.float64))


def test_results_are_writable_native_arrays(client):
    got = client.embed([1.0], dim=4, **LDM)
    assert got.flags.writeable and got.dtype.isnative
    got += 1  # must not raise


# --- presets ---------------------------------------------------------------

# The guide's preset table: name -> (dim, flip_sin_to_cos, shift, extra).
GUIDE_PRESETS = {
    "sd15": (320, True, 0.0, {}),
    "sd21": (320, True, 0.0, {}),
    "sdxl": (320, True, 0.0, {}),
    "sdxl-add-time": (256, True, 0.0, {}),
    "ddpm": (128, False, 1.0, {}),
    "dit": (256, True, 0.0, {}),
    "dit-diffusers": (256, True, 1.0, {}),
    "pixart": (256, True, 0.0, {}),
    "sd3": (256, True, 0.0, {}),
    "hunyuan-video": (256, True, 0.0, {}),
    "flux": (256, True, 0.0, {"time_factor": 1000.0}),
}


def test_server_info_lists_the_guide_presets(info):
    assert info.version == temb.__version__
    assert info.backend in ("cpu", "cuda")
    assert info.limits.max_dim > 0 and info.limits.max_batch > 0
    names = {p.name for p in info.presets}
    missing = (set(GUIDE_PRESETS) | {"wan", "transformer"}) - names
    assert not missing, f"presets missing from the server: {missing}"


@pytest.mark.parametrize("name", sorted(GUIDE_PRESETS))
def test_preset_follows_the_guide(client, name):
    dim, flip, shift, extra = GUIDE_PRESETS[name]
    t = [0.0, 0.5, 999.0] if name != "flux" else [0.0, 0.25, 1.0]
    got = client.embed(t, preset=name, dtype="fp32")
    want = reference.embedding(t, dim, flip_sin_to_cos=flip,
                               downscale_freq_shift=shift, **extra)
    assert_within_fp32_bound(got, want, t, time_factor=extra.get("time_factor", 1.0))


def _table_embedding(t, dim, spec):
    """The float64 embedding of a preset with a frequency table, and the
    bound its float32 table values allow (2^-23 of each angle)."""
    half = dim // 2
    if spec.frequencies:
        freqs = np.asarray(spec.frequencies, dtype=np.float64)
    else:
        low, high = spec.log_spaced_frequencies
        freqs = np.exp(np.linspace(np.log(low), np.log(high), half))
    tf = spec.time_factor or 1.0
    angles = (spec.scale or 1.0) * (tf * np.float64(t))[:, None] * freqs[None, :]
    first, second = ((np.cos(angles), np.sin(angles)) if spec.flip_sin_to_cos
                     else (np.sin(angles), np.cos(angles)))
    want = np.zeros((len(t), dim))
    want[:, :half], want[:, half:2 * half] = first, second
    return want, 1e-9 + 2.0 ** -23 * np.abs(angles).max()


def test_every_preset_matches_its_reported_spec(client, info):
    t = [0.0, 0.5, 3.0]
    for preset in info.presets:
        spec = preset.spec
        dim = spec.dim or 64
        if spec.frequencies or spec.log_spaced_frequencies:
            small = [0.0, 1e-4, 2.5e-3]  # keeps the table's rounding small
            got = client.embed(small, preset=preset.name,
                               dim=None if spec.dim else dim, dtype="fp64",
                               precision="fp64")
            want, bound = _table_embedding(small, dim, spec)
            np.testing.assert_allclose(got, want, atol=bound, err_msg=preset.name)
            continue
        got = client.embed(t, preset=preset.name,
                           dim=None if spec.dim else dim, dtype="fp64",
                           precision="fp64")
        want = reference.embedding(
            t, dim, flip_sin_to_cos=bool(spec.flip_sin_to_cos),
            downscale_freq_shift=spec.downscale_freq_shift or 0.0,
            max_period=spec.max_period or 10000.0, scale=spec.scale or 1.0,
            time_factor=spec.time_factor or 1.0,
            repeat_only=bool(spec.repeat_only), layout=spec.layout or "halves")
        np.testing.assert_allclose(got, want, atol=1e-9, err_msg=preset.name)


def test_preset_default_dtype_and_dim_override(client, info):
    for preset in info.presets:
        got = client.embed([1.0], preset=preset.name,
                           dim=None if preset.spec.dim else 64)
        want = {"fp32": np.float32, "fp16": np.float16, "fp64": np.float64,
                None: np.float32}.get(preset.default_dtype)
        if want is not None:
            assert got.dtype == want, preset.name
    transformer = info.preset("transformer")
    if transformer is None or not transformer.dim_overridable:
        pytest.skip("the server has no dim-overridable 'transformer' preset")
    got = client.embed([2.0], preset="transformer", dim=4)
    assert got.shape == (1, 4)
    want = reference.embedding([2.0], 4, flip_sin_to_cos=False,
                               downscale_freq_shift=0.0, layout="interleaved")
    assert_within_fp32_bound(got, want, [2.0])


def test_exponent_order(client):
    """slope_first evaluates the exponent as fl32(i * fl32(-ln P / (H -
    shift))), LongCat-AudioDiT's and Ideogram 4's order; the default divides
    last.  Recomputed here in numpy from the op order, not read back."""
    t = np.float32([0.0, 0.25, 0.5, 0.999, 1.0])
    convention = dict(dim=256, flip_sin_to_cos=False, downscale_freq_shift=1,
                      time_factor=1000)
    slope_first = client.embed(t, exponent_order="slope_first", **convention)
    divide_last = client.embed(t, **convention)
    assert not np.array_equal(slope_first, divide_last)
    np.testing.assert_array_equal(
        divide_last, client.embed(t, exponent_order="divide_last", **convention))
    slope = np.float32(-np.log(10000.0) / 127)
    exponents = np.arange(128, dtype=np.float32) * slope
    freqs = np.exp(exponents.astype(np.float64)).astype(np.float32)
    angles = (np.float32(1000) * t)[:, None] * freqs[None, :]
    want = np.concatenate([np.sin(angles.astype(np.float64)),
                           np.cos(angles.astype(np.float64))], axis=1)
    # Equal angles: sin/cos within an ulp of the float64 values of the same
    # float32 angle (not the looser bound of a different op order).
    np.testing.assert_allclose(slope_first, want, rtol=0, atol=1.2e-7)
    info = client.server_info()
    longcat = info.preset("longcat-audio-dit")
    if longcat is not None:
        assert longcat.spec.exponent_order == "slope_first"
        np.testing.assert_array_equal(
            client.embed(t, preset="longcat-audio-dit"), slope_first)


# --- inputs ----------------------------------------------------------------

def test_timestep_input_types(client):
    want = client.embed([1.0, 2.0, 3.0], dim=16, **LDM)
    for timesteps in ([1, 2, 3], (1.0, 2.0, 3.0), np.array([1, 2, 3], np.int32),
                      np.array([1, 2, 3], np.uint8), np.array([1., 2., 3.]),
                      np.array([1., 2., 3.], np.float16)):
        np.testing.assert_array_equal(client.embed(timesteps, dim=16, **LDM), want)
    scalar = client.embed(np.float32(2.0), dim=16, **LDM)
    np.testing.assert_array_equal(scalar, want[1:2])


def test_integer_timesteps_become_float32(client):
    big = 2 ** 24 + 1  # not representable in float32: rounds to 2^24
    as_int = client.embed([big], dim=16, **LDM)
    as_float = client.embed([float(2 ** 24)], dim=16, **LDM)
    np.testing.assert_array_equal(as_int, as_float)


def test_float64_timesteps_are_sent_as_float32(client):
    t = np.array([0.1, 999.123456789])
    np.testing.assert_array_equal(client.embed(t, dim=16, **LDM),
                                  client.embed(t.astype(np.float32), dim=16, **LDM))


def test_bad_inputs_fail_before_sending(client):
    with pytest.raises(ValueError, match="at most 5 dimensions"):
        client.embed(np.zeros((1, 2, 1, 1, 1, 1)), dim=8, **LDM)
    with pytest.raises(TypeError):
        client.embed([True, False], dim=8, **LDM)
    with pytest.raises(ValueError, match="dtype"):
        client.embed([1.0], dim=8, dtype="int8", **LDM)
    with pytest.raises(ValueError, match="layout"):
        client.embed([1.0], dim=8, layout="diagonal", **LDM)
    with pytest.raises(ValueError, match="exponent_order"):
        client.embed([1.0], dim=8, exponent_order="slope", **LDM)
    with pytest.raises(ValueError, match="return_tensors"):
        client.embed([1.0], dim=8, return_tensors="tf", **LDM)


# --- large outputs ---------------------------------------------------------

def test_output_over_4_mib(client, info):
    rows, dim = 4096, 320  # 5 MiB of float32: over gRPC's default 4 MiB
    if rows > info.limits.max_batch or rows * dim * 4 > info.limits.max_output_bytes:
        pytest.skip("the server's limits are below 5 MiB")
    t = np.linspace(0, 1000, rows, dtype=np.float32)
    got = client.embed(t, dim=dim, **LDM)
    assert got.nbytes > 4 << 20
    assert_within_fp32_bound(got, reference.embedding(t, dim, **LDM), t)


def test_client_message_limit_is_enforced(server):
    with temb.Client(server.target, max_message_bytes=1 << 20) as small:
        small.embed(np.zeros(100, np.float32), dim=320, **LDM)  # 125 KiB
        with pytest.raises(temb.ResourceExhaustedError) as e:
            small.embed(np.zeros(1024, np.float32), dim=320, **LDM)  # 1.25 MiB
        assert e.value.code.name == "RESOURCE_EXHAUSTED"
