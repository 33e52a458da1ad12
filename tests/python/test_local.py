"""temb.local, the in-process engine, against the real server: the same bytes
for every preset, dtype, timestep_dtype, shape, input kind and part, the same
errors (class, code and message), the same signature; temb.torch on top of
it; and the package without the extension.

The extension is found where the build tree of the server under test puts it
(<build>/python, from TEMB_SERVER_BIN: conftest.py) unless
TEMB_LOCAL_EXTENSION_DIR says otherwise; without it (a build with TEMB_BUILD_PYTHON_EXTENSION=OFF) the
tests skip.
"""

import inspect
import os
import pathlib
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest

import temb

import temb.local  # noqa: E402  (conftest chose the extension directory)

LDM = dict(flip_sin_to_cos=True, downscale_freq_shift=0.0)
TIMESTEPS = np.array([0.0, 1.0, 0.5, 999.0, 250.25, -3.0, 1e-3, 0.8929],
                     np.float32)
DTYPES = ("fp32", "fp16", "bf16", "fp64")


@pytest.fixture(scope="module")
def local():
    """The module, its default engine computing as the server under test
    does (--backend=cpu: on a GPU machine the default, auto, would compute
    large outputs with CUDA's sincosf, an ulp away from the CPU's at
    times)."""
    try:
        temb.local.default_engine().backend
    except ImportError as e:
        pytest.skip(f"temb.local's extension is not built: {e}")
    temb.local.configure(backend="cpu")
    yield temb.local
    temb.local.configure()


def _bits(result):
    """The bytes of a result (numpy, or torch via numpy), dtype included."""
    if not isinstance(result, np.ndarray):  # torch
        import torch
        if result.dtype == torch.bfloat16:
            result = result.view(torch.int16)
        result = result.numpy()
    return result.dtype.str, result.shape, result.tobytes()


def assert_same(got, want):
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want)
        for name in want:
            assert_same(got[name], want[name])
        return
    assert type(got) is type(want)
    assert _bits(got) == _bits(want)
    if isinstance(got, np.ndarray):
        assert got.flags.writeable and got.flags.c_contiguous


def both(client, local, *args, **kwargs):
    """Calls the server and the engine alike; asserts equal bytes (or the
    same error) and returns the server's result."""
    try:
        want = client.embed(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - compared below
        with pytest.raises(type(e)) as got:
            local.embed(*args, **kwargs)
        assert str(got.value) == str(e)
        if isinstance(e, temb.TembError):
            assert got.value.code == e.code and got.value.details == e.details
            assert got.value.request_id == e.request_id
        return e
    assert_same(local.embed(*args, **kwargs), want)
    # Once more: the second call takes the cached plan.
    assert_same(local.embed(*args, **kwargs), want)
    return want


# --- the same numbers ----------------------------------------------------------

def test_every_preset_and_dtype(client, local, info):
    for preset in info.presets:
        dim = None if preset.spec.dim else 64
        for dtype in DTYPES:
            both(client, local, TIMESTEPS, dim, preset.name, dtype,
                 bf16_format="bits")
        both(client, local, TIMESTEPS, dim, preset.name)  # preset's own dtype


@pytest.mark.parametrize("preset", ["flux", "sd3", "qwen-image", "chroma"])
@pytest.mark.parametrize("timestep_dtype", ["bf16", "fp16", "fp32"])
def test_timestep_dtype(client, local, preset, timestep_dtype):
    sigmas = np.linspace(0, 1, 37, dtype=np.float32)
    for dtype in ("fp32", "bf16"):
        both(client, local, sigmas, preset=preset, dtype=dtype,
             timestep_dtype=timestep_dtype, bf16_format="bits")


@pytest.mark.parametrize("options", [
    dict(dim=320, **LDM), dict(dim=7, flip_sin_to_cos=False,
                               downscale_freq_shift=1.0),
    dict(dim=1, **LDM), dict(dim=16, layout="interleaved",
                             flip_sin_to_cos=False, downscale_freq_shift=0),
    dict(dim=9, repeat_only=True), dict(dim=64, scale=1000, **LDM),
    dict(dim=64, time_factor=1000, max_period=2000, **LDM),
    dict(dim=64, precision="fp64", **LDM),
    dict(dim=256, flip_sin_to_cos=False, downscale_freq_shift=1,
         time_factor=1000, exponent_order="slope_first"),
    dict(dim=33, exponent_order="divide_last", **LDM),
    dict(dim=8, flip_sin_to_cos=True, frequencies=[1.0, 0.5, 0.25, 1e-3]),
    dict(dim=8, flip_sin_to_cos=True,
         frequencies=np.array([1.0, 0.5, 0.25, 1e-3])),
    dict(dim=8, flip_sin_to_cos=True, frequencies=(1.0, 0.5, 0.25, 1e-3)),
    dict(dim=16, flip_sin_to_cos=True, log_spaced_frequencies=(0.5, 1e4)),
    dict(preset="ldm", dim=96), dict(preset="sdxl", precision="fp64"),
])
def test_explicit_specs(client, local, options):
    for dtype in DTYPES:
        both(client, local, TIMESTEPS, dtype=dtype, bf16_format="bits",
             **options)


@pytest.mark.parametrize("shape", [(), (0,), (1,), (5,), (2, 3), (2, 0),
                                   (3, 1), (1, 2, 3), (2, 1, 3, 1, 1)])
def test_shapes(client, local, shape):
    t = (np.arange(int(np.prod(shape)), dtype=np.float32) * 37.5).reshape(shape)
    got = both(client, local, t, preset="sdxl")
    assert got.shape == (shape or (1,)) + (320,)


def test_input_kinds(client, local):
    torch = pytest.importorskip("torch")
    big = [0, 1, 999, -7, 2**24 + 1, 2**40 + 12345, -(2**53) - 3, 2**62]
    kinds = [
        999, 999.5, [1, 2, 3], [1, 2.5], big, np.array(big),
        np.array(big)[::2],  # strided
        np.arange(10, dtype=np.uint8), np.arange(10, dtype=np.int16),
        np.array([0.1, 1e-8, 3.4e38, 999.9], np.float64),
        np.array([1.5, 2.5], np.float16), TIMESTEPS[::2], TIMESTEPS[::-1],
        TIMESTEPS.astype(">f4"),  # big-endian
        torch.tensor(big), torch.tensor([999.0, 0.25]),
        torch.tensor(TIMESTEPS, requires_grad=True),
        torch.arange(14.0).reshape(2, 7).t(),  # not contiguous
        torch.arange(14).reshape(2, 7),
        torch.tensor([0.89, 0.5], dtype=torch.bfloat16),
        torch.tensor([0.89, 0.5], dtype=torch.float64),
        torch.tensor(3.0), torch.tensor([1, 2], dtype=torch.int32),
        torch.tensor([0.25, 0.5])._neg_view(),
    ]
    for t in kinds:
        both(client, local, t, preset="dit")
        both(client, local, t, preset="flux", timestep_dtype="bf16")


def test_misaligned_timesteps(client, local):
    data = np.zeros(4 * 8 + 1, np.uint8)
    t = np.ndarray(shape=(8,), dtype=np.float32, buffer=data, offset=1)
    t[:] = TIMESTEPS
    assert not t.flags.aligned
    both(client, local, t, preset="sd15")


def test_return_tensors_and_bf16_formats(client, local):
    pytest.importorskip("torch")
    for dtype in DTYPES:
        both(client, local, TIMESTEPS, preset="sdxl", dtype=dtype,
             return_tensors="pt")
    for fmt in ("auto", "float32", "bits"):
        both(client, local, TIMESTEPS, preset="flux", dtype="bf16",
             bf16_format=fmt)


def test_large_output(client, local):
    rng = np.random.default_rng(7)
    t = (rng.random(4096) * 1000).astype(np.float32)
    both(client, local, t, dim=1280, preset="ldm")
    both(client, local, t, dim=1280, preset="ldm", dtype="bf16",
         bf16_format="bits")


# --- parts ---------------------------------------------------------------------

def test_parts(client, local):
    g = np.array([3.5, 1.0], np.float32)
    s = np.array([0.8929, 0.25], np.float32)
    for kwargs in (
            dict(parts={"timestep": s, "guidance": g}, preset="flux",
                 timestep_dtype="bf16"),
            dict(parts={"time": [999, 1], "add_time": np.arange(12).reshape(2, 6)},
                 preset="sdxl"),
            dict(parts={"a": {"timesteps": s, "dim": 6, **LDM},
                        "b": {"timesteps": g, "preset": "sd3", "dtype": "bf16"}},
                 dtype="fp16", bf16_format="bits"),
            dict(parts={"timestep": s}, preset="flux", request_id="r-1"),
            dict(parts={"timestep": s, "guidance": [float("nan")]},
                 preset="flux", request_id="r-2"),
            dict(parts={"x": {"timesteps": s, "preset": "nope"}}),
            dict(parts={"x" * 300: s}, preset="sd3"),
            dict(parts={str(i): [1.0] for i in range(65)}, preset="sd3"),
    ):
        both(client, local, **kwargs)
    want = client.embed_parts({"timestep": s, "guidance": g}, preset="flux",
                              return_tensors="pt")
    assert_same(local.embed_parts({"timestep": s, "guidance": g},
                                  preset="flux", return_tensors="pt"), want)


def test_request_id_is_checked_and_echoed(client, local):
    both(client, local, [1.0], preset="sd15", request_id="x" * 1025)
    error = both(client, local, [float("inf")], preset="sd15",
                 request_id="trace-7")
    assert isinstance(error, temb.InvalidArgumentError)
    assert error.request_id == "trace-7"


# --- the same errors -------------------------------------------------------------

@pytest.mark.parametrize("args, kwargs", [
    (([1.0],), dict(preset="nope")),
    (([1.0, float("nan")],), dict(preset="sd15")),
    (([1.0, float("inf")],), dict(dim=8, **LDM)),
    (([1.0],), dict(dim=8)),
    (([1.0],), dict(dim=8, flip_sin_to_cos=True)),
    (([1.0],), dict(preset="sdxl", scale=2.0)),
    (([1.0],), dict(preset="sdxl", dim=64)),
    (([1.0],), dict(preset="ldm")),
    (([1.0],), dict(dim=7, layout="interleaved", flip_sin_to_cos=False,
                    downscale_freq_shift=0)),
    (([1.0],), dict(dim=2, flip_sin_to_cos=True, downscale_freq_shift=1)),
    (([1.0],), dict(dim=100000, **LDM)),
    (([1.0],), dict(dim=0, **LDM)),
    (([1e30],), dict(dim=8, scale=1e10, **LDM)),
    ((np.zeros(65537, np.float32),), dict(preset="dit")),
    ((np.zeros(65536, np.float32),), dict(preset="cosmos", dim=8192,
                                          dtype="fp64")),
    (([70000.0],), dict(preset="sd3", timestep_dtype="fp16")),
    (([1.0],), dict(preset="sd3", timestep_dtype="fp64")),
    (([1.0],), dict(preset="sd3", dtype="int8")),
    (([1.0],), dict(preset="sd3", layout="diagonal", dim=8)),
    (([1.0],), dict(dim=8, exponent_order="slope", **LDM)),
    (([1.0],), dict(preset="sd3", exponent_order="slope_first")),
    (([1.0],), dict(preset="sd3", return_tensors="tf")),
    (([1.0],), dict(preset="sd3", bf16_format="half")),
    ((np.zeros((1,) * 6, np.float32),), dict(preset="sd3")),
    ((np.zeros((1,) * 6, np.int64),), dict(preset="sd3")),
    ((np.array([1 + 2j]),), dict(preset="sd3")),
    ((np.array([True]),), dict(preset="sd3")),
    ((["a"],), dict(preset="sd3")),
    (([1.0],), dict(dim=8, flip_sin_to_cos=True, frequencies=[1.0, 2.0])),
    (([1.0],), dict(dim=8, flip_sin_to_cos=True, frequencies=[[1.0]])),
    (([1.0],), dict(dim=8, flip_sin_to_cos=True,
                    log_spaced_frequencies=(0.0, 1.0))),
    (([1.0],), dict(dim=8, flip_sin_to_cos=True, frequencies=[1.0] * 4,
                    log_spaced_frequencies=(0.5, 1.0))),
    ((), dict(preset="sd3")),
    (([1.0],), dict(preset="sd3", parts={"a": [1.0]})),
    (([1.0],), dict(preset="sd3", parts=[1.0])),
    (([1.0],), dict(preset="sd3", parts={})),
    (([1.0],), dict(preset="sd3", not_an_option=1)),
    (([1.0], 8, "sd3", "fp32", "extra"), {}),
])
def test_errors(client, local, args, kwargs):
    error = both(client, local, *args, **kwargs)
    assert isinstance(error, Exception)


def test_errors_with_torch_inputs(client, local):
    torch = pytest.importorskip("torch")
    for t in (torch.zeros((1,) * 6), torch.tensor([True]),
              torch.tensor([1 + 1j]), torch.zeros(2, device="meta"),
              torch.tensor([float("nan")])):
        assert isinstance(both(client, local, t, preset="sd3"), Exception)


def test_a_failed_call_leaves_its_plan_usable(client, local):
    both(client, local, [float("nan")], preset="pixart", dtype="fp16")
    both(client, local, [1.0, 2.0], preset="pixart", dtype="fp16")
    both(client, local, [70000.0], preset="pixart", timestep_dtype="fp16")
    both(client, local, [7.0], preset="pixart", timestep_dtype="fp16")


def test_plans_are_keyed_by_every_argument(local):
    t = [999.0]
    base = local.embed(t, dim=64, **LDM)
    assert not np.array_equal(local.embed(t, dim=64, flip_sin_to_cos=False,
                                          downscale_freq_shift=0.0), base)
    assert local.embed(t, dim=64, dtype="fp16", **LDM).dtype == np.float16
    assert local.embed(t, 64, None, "fp64", **LDM).dtype == np.float64
    np.testing.assert_array_equal(local.embed(t, 64, **LDM), base)
    np.testing.assert_array_equal(local.embed(timesteps=t, dim=64, **LDM), base)
    np.testing.assert_array_equal(
        local.embed(t, dim=64, timeout=3, **LDM), base)


# --- the rest of the client's surface ------------------------------------------------

def test_signatures_equal_the_clients(client, local):
    assert inspect.signature(local.embed) == inspect.signature(client.embed)
    assert (inspect.signature(local.embed_parts)
            == inspect.signature(client.embed_parts))


def test_embed_function_is_embed_with_a_plan_made_once(client, local):
    """Engine.embed_function: for 1-D float32 timesteps (numpy or a CPU
    tensor, a negated view included) what the client's embed() returns;
    what it cannot take is refused, what the server refuses raises."""
    engine = local.Engine(backend="cpu")
    for arguments in (dict(preset="sdxl"), dict(dim=7, **LDM),
                      dict(preset="flux", dtype="bf16", bf16_format="bits"),
                      dict(preset="wan", dtype="fp64", timeout=30)):
        embed = engine.embed_function(**arguments)
        want = client.embed(TIMESTEPS, **arguments)
        assert_same(embed(TIMESTEPS), want)
    with pytest.raises(temb.InvalidArgumentError, match="dim"):
        engine.embed_function(dim=0, **LDM)
    with pytest.raises(TypeError, match="timesteps, parts and request_id"):
        engine.embed_function(preset="sdxl", request_id="r-1")
    try:
        import torch
    except ImportError:
        return
    embed = engine.embed_function(preset="sd3", return_tensors="pt")
    tensor = torch.from_numpy(TIMESTEPS)
    want = client.embed(TIMESTEPS, preset="sd3", return_tensors="pt")
    assert_same(embed(tensor), want)
    assert_same(embed(torch._neg_view(-tensor)), want)


def test_settings_make_an_equal_engine(local):
    engine = local.Engine(backend="cpu", cpu_threads=2)
    assert engine.settings == dict(backend="cpu", cpu_threads=2,
                                   gpu_min_output_bytes=None,
                                   presets_file=None)
    engine.settings["backend"] = "cuda"  # a copy
    again = local.Engine(**engine.settings)
    assert repr(again) == repr(engine) and again.backend == "cpu"


def test_server_info(local, info):
    mine = local.server_info()
    assert mine.version == info.version == temb.__version__
    assert mine.presets == info.presets
    assert (mine.limits.max_dim, mine.limits.max_batch,
            mine.limits.max_output_bytes) == (
        info.limits.max_dim, info.limits.max_batch,
        info.limits.max_output_bytes)
    assert mine.backend in ("cpu", "cuda")


def test_embed_stream(client, local):
    items = [dict(timesteps=[1.0], preset="sd3"),
             dict(timesteps=[float("nan")], preset="sd3"),
             dict(parts={"timestep": [0.5], "guidance": [3.5]}, preset="flux")]
    want = list(client.embed_stream(items, raise_errors=False))
    got = list(local.embed_stream(items, raise_errors=False))
    assert len(got) == len(want) == 3
    assert_same(got[0], want[0])
    assert type(got[1]) is type(want[1]) and got[1].details == want[1].details
    assert_same(got[2], want[2])
    with pytest.raises(temb.InvalidArgumentError):
        list(local.embed_stream(items))


def test_threads_share_an_engine(client, local):
    rng = np.random.default_rng(3)
    inputs = [(rng.random(n) * 1000).astype(np.float32)
              for n in (1, 17, 3000, 4096)]
    wants = [client.embed(t, dim=512, preset="ldm") for t in inputs]
    failures = []

    def work(i):
        for _ in range(5):
            got = local.embed(inputs[i % 4], dim=512, preset="ldm")
            if got.tobytes() != wants[i % 4].tobytes():
                failures.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


def test_engines_with_their_own_settings(client, local):
    engine = temb.local.Engine(backend="cpu", cpu_threads=1)
    assert engine.backend == "cpu" and "1 thread" in engine.device
    t = (np.arange(5000) * 0.2).astype(np.float32)
    assert_same(engine.embed(t, preset="sd15"), client.embed(t, preset="sd15"))
    with pytest.raises(temb.InvalidArgumentError, match="backend must be"):
        temb.local.Engine(backend="tpu").embed([1.0], preset="sd15")
    assert temb.local.engine() is temb.local.default_engine()
    assert temb.local.engine(cpu_threads=1) is not temb.local.default_engine()


# --- temb.torch --------------------------------------------------------------------

def test_torch_timesteps_module_on_the_local_engine(client, local):
    torch = pytest.importorskip("torch")
    from temb.torch import Timesteps
    t = torch.tensor([0, 1, 250, 999])
    for args in ((320, True, 0), (7, False, 1), (64, True, 0, 1000)):
        want = Timesteps(*args, client=client)(t)
        for engine in (local, local.default_engine(),
                       local.Engine(backend="cpu")):
            module = Timesteps(*args, client=engine)
            got = module(t)
            assert got.dtype == torch.float32 and torch.equal(got, want)
        assert "temb.local" in repr(module)
        clone = pickle.loads(pickle.dumps(module))
        assert torch.equal(clone(t), want)
        compiled = torch.compile(module, fullgraph=True, backend="eager")
        assert torch.equal(compiled(t), want)


def test_torch_module_direct_calls_on_the_local_engine(client, local):
    """A plain eager call of 1-D float32 CPU timesteps on an engine computes
    from a plan the module made once: the numbers are the server's through
    the registered op; a negated view, a new preset catalogue or core
    (configure) and changed attributes are all honoured."""
    torch = pytest.importorskip("torch")
    import temb.torch as ttorch
    engine = local.Engine(backend="cpu")
    module = ttorch.Timesteps(64, True, 0.0, client=engine)
    served = ttorch.Timesteps(64, True, 0.0, client=client)
    t = torch.tensor([1.0, 500.0, 999.0, 0.25])
    assert torch.equal(module(t), served(t))
    assert module._direct[2] is not None
    negated = torch._neg_view(-t)
    assert negated.is_neg() and torch.equal(module(negated), served(t))
    assert torch.equal(served(negated), served(t))
    assert torch.equal(local.embed(negated, dim=64, flip_sin_to_cos=True,
                                   downscale_freq_shift=0.0,
                                   return_tensors="pt"), served(t))
    module.num_channels = 33
    served.num_channels = 33
    assert torch.equal(module(t), served(t))
    old_core = engine._get_core()
    engine._reset(dict(engine._arguments, cpu_threads=1))
    assert torch.equal(module(t), served(t))
    assert engine._core is not None and engine._core is not old_core
    with pytest.raises(temb.InvalidArgumentError, match="timestep"):
        module(torch.tensor([float("nan")]))


def test_torch_patch_with_the_local_engine(client, local):
    pytest.importorskip("torch")
    embeddings = pytest.importorskip("diffusers.models.embeddings")
    import torch
    import temb.torch
    model = torch.nn.Sequential(embeddings.Timesteps(256, True, 0),
                                embeddings.Timesteps(128, False, 1))
    t = torch.tensor([3, 500])
    names = temb.torch.patch(model, client=local)
    assert names == ["0", "1"]
    served = torch.nn.Sequential(embeddings.Timesteps(256, True, 0))
    temb.torch.patch(served, client=client)
    assert torch.equal(model[0](t), served[0](t))


# --- fork -----------------------------------------------------------------------------

_FORK_SCRIPT = r"""
import os, sys, time
import numpy as np
import temb.local

engine = temb.local.Engine(backend="cpu", cpu_threads=2)
t = np.arange(1024, dtype=np.float32) * 0.75
spec = dict(dim=1280, flip_sin_to_cos=True, downscale_freq_shift=0.0)
want = engine.embed(t, **spec)  # large enough for a team of threads
pid = os.fork()
if pid == 0:
    got = engine.embed(t, **spec)
    os._exit(0 if got.tobytes() == want.tobytes() else 3)
for _ in range(600):  # a child stuck on the parent's threads never ends
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.1)
else:
    os.kill(pid, 9)
    raise SystemExit("the forked child did not finish in 60 s")
assert os.waitstatus_to_exitcode(status) == 0, status
assert engine.embed(t, **spec).tobytes() == want.tobytes()
print("ok")
"""


def test_a_forked_child_computes(local, client_dir):
    """A child forked after a multi-threaded call (a data-loader worker)
    computes, on its own thread, the same numbers; the parent keeps its
    threads."""
    env = dict(os.environ, PYTHONPATH=str(client_dir))
    result = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", \
        result.stdout + result.stderr


# --- without the extension ------------------------------------------------------------

def test_without_the_extension(tmp_path, client_dir):
    code = (
        "import temb, temb.local\n"
        "assert not temb.local.available()\n"
        "try:\n"
        "    temb.local.embed([1.0], preset='sd15')\n"
        "except ImportError as e:\n"
        "    assert 'temb_local_ext' in str(e) and 'TEMB_LOCAL_EXTENSION_DIR' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
        "print('ok')\n")
    env = dict(os.environ, TEMB_LOCAL_EXTENSION_DIR=str(tmp_path),
               PYTHONPATH=str(client_dir))
    result = subprocess.run([sys.executable, "-c", code], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", (
        result.stdout + result.stderr)
