"""The CUDA backend behind the real server: every preset and every output
dtype against the CPU backend's server, the size router under many
concurrent clients, and a drain with GPU calls in flight.

Labelled gpu.  Without a usable GPU every test skips and says why; with
TEMB_REQUIRE_CUDA set (scripts/gpu-check.sh) a missing GPU is a failure, so
that a broken driver cannot pass as skipped.
"""
import contextlib
import json
import os
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest

from conftest import SERVER, TEMB, TembServer

# Timesteps as pipelines send them (integer steps, fractional flow-matching
# sigmas scaled to [0, 1000]) plus both signs and the awkward values the
# kernel tests use.
TIMESTEPS = np.concatenate([
    np.arange(0, 1000, 7, dtype=np.float32),
    np.linspace(0, 1, 97, dtype=np.float32),
    np.float32([-3.5, 0.125, 999.999, 4242.5, -1e4, 1e4]),
])
DTYPES = {1: ("fp32", np.uint32), 2: ("fp16", np.uint16),
          3: ("bf16", np.uint16), 4: ("fp64", np.uint64)}
OPTIONS = [("grpc.max_receive_message_length", 512 << 20)]


def start_or_skip(tmp_path, *flags, **options):
    """A server on the CUDA backend, or a skip (a failure under
    TEMB_REQUIRE_CUDA) when the GPU is not usable."""
    try:
        return TembServer(SERVER, tmp_path, "--log_level=warn", *flags,
                          **options)
    except Exception as error:  # the server exits at once without a GPU
        if os.environ.get("TEMB_REQUIRE_CUDA"):
            raise
        pytest.skip(f"no usable CUDA device: {error}")


@contextlib.contextmanager
def stubs(pb, *servers):
    """One temb.v1 stub per server, on channels closed afterwards."""
    with contextlib.ExitStack() as stack:
        yield [pb[1].EmbeddingServiceStub(stack.enter_context(
            grpc.insecure_channel(s.target, options=OPTIONS)))
            for s in servers]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    cuda = start_or_skip(tmp_path_factory.mktemp("cuda"), "--backend=cuda")
    cpu = TembServer(SERVER, tmp_path_factory.mktemp("cpu"),
                     "--log_level=warn", "--backend=cpu")
    yield cuda, cpu
    cuda.kill()
    cpu.kill()


def ordered(bits, width):
    """Sign-magnitude bit patterns as integers in the order of the floats,
    so that the difference of two is their distance in ulps."""
    bits = bits.astype(np.int64) if width < 64 else bits.view(np.int64)
    sign = np.int64(1) << (width - 1)
    magnitude = bits & (sign - 1) if width < 64 else bits & np.int64(
        0x7FFFFFFFFFFFFFFF)
    return np.where(bits & sign if width < 64 else bits < 0, -magnitude,
                    magnitude)


def ulps_apart(cpu, cuda, dtype, fp64_math):
    """Element-wise distance in units of the format compared: the output's,
    except that an fp64 output of float32 math is compared as the float it
    must be exactly."""
    name, storage = DTYPES[dtype]
    a = np.frombuffer(cpu, dtype=storage)
    b = np.frombuffer(cuda, dtype=storage)
    if name == "fp64" and not fp64_math:
        a32 = a.view(np.float64).astype(np.float32)
        b32 = b.view(np.float64).astype(np.float32)
        assert np.array_equal(a32.astype(np.float64).view(np.uint64), a)
        assert np.array_equal(b32.astype(np.float64).view(np.uint64), b)
        a, b, width = a32.view(np.uint32), b32.view(np.uint32), 32
    else:
        width = 8 * a.itemsize
    return np.abs(ordered(a, width) - ordered(b, width))


def test_every_preset_and_dtype_agrees_with_the_cpu(servers, pb):
    """Each preset of the catalogue, in fp32, fp16, bf16 and fp64, computed
    by the CUDA server, is within the parity suite's bounds of the CPU
    server's answer: 4 fp32 ulps (sincosf <= 2, the CPU <= 1), one unit of a
    16-bit format, exact for repeat_only."""
    v1 = pb[0]
    with stubs(pb, *servers) as (gpu_stub, cpu_stub):
        info = gpu_stub.GetServerInfo(v1.GetServerInfoRequest(), timeout=10)
        assert info.backend == "cuda", info
        assert len(info.presets) >= 50, [p.name for p in info.presets]
        presets = [p for p in info.presets if not p.parts]  # parts: below
        checked, worst = 0, {}
        for preset in presets:
            for dtype in DTYPES:
                request = v1.EmbedRequest(preset=preset.name, dtype=dtype,
                                          timesteps=TIMESTEPS.tolist())
                if not preset.spec.HasField("dim"):  # e.g. ldm: any width
                    request.spec.dim = 320
                expected = cpu_stub.Embed(request, timeout=30)
                actual = gpu_stub.Embed(request, timeout=30)
                assert actual.backend == "cuda"
                assert list(actual.embedding.shape) == list(
                    expected.embedding.shape), preset.name
                spec = preset.spec
                fp64_math = spec.precision == v1.PRECISION_FP64
                distance = ulps_apart(expected.embedding.data,
                                      actual.embedding.data, dtype, fp64_math)
                allowed = (0 if spec.repeat_only else
                           1 if dtype in (2, 3) or (fp64_math and dtype == 1)
                           else 4)
                assert distance.max(initial=0) <= allowed, (
                    f"{preset.name} {DTYPES[dtype][0]}: "
                    f"{int(distance.max())} ulp, allowed {allowed}")
                key = DTYPES[dtype][0]
                equal = float(np.mean(distance == 0)) if distance.size else 1.0
                worst[key] = min(worst.get(key, 1.0), equal)
                checked += 1
    assert checked == 4 * len(presets)
    # The smallest share of bitwise-equal elements per dtype, for the log.
    print(f"{len(presets)} presets x 4 dtypes; worst bitwise-equal share: "
          f"{worst}")


def test_parts_presets_agree_with_the_cpu(servers, pb):
    """Multi-part presets (flux's timestep and guidance, SDXL's time ids)
    computed on the GPU, part by part, against the CPU."""
    v1 = pb[0]
    with stubs(pb, *servers) as (gpu_stub, cpu_stub):
        info = gpu_stub.GetServerInfo(v1.GetServerInfoRequest(), timeout=10)
        with_parts = [p for p in info.presets if p.parts]
        assert with_parts
        for preset in with_parts:
            request = v1.EmbedRequest(preset=preset.name, parts=[
                v1.EmbedPart(name=part.name, timesteps=TIMESTEPS[:40].tolist())
                for part in preset.parts])
            expected = cpu_stub.Embed(request, timeout=30)
            actual = gpu_stub.Embed(request, timeout=30)
            assert [p.name for p in actual.parts] == [
                p.name for p in expected.parts]
            for e, a in zip(expected.parts, actual.parts):
                distance = ulps_apart(e.tensor.data, a.tensor.data,
                                      e.tensor.dtype or 1, False)
                allowed = 1 if e.tensor.dtype in (2, 3) else 4
                assert distance.max(initial=0) <= allowed, (preset.name,
                                                            e.name)


def test_auto_routes_by_size_under_load(tmp_path, pb):
    """--backend=auto under 32 concurrent clients mixing small answers
    (CPU) and large ones (GPU): every call succeeds, and each answer equals
    what the backend it is routed to computes alone."""
    v1, v1_grpc = pb
    for name in ("auto", "cuda", "cpu"):
        (tmp_path / name).mkdir()
    cuda = start_or_skip(tmp_path / "cuda", "--backend=cuda")
    auto = TembServer(SERVER, tmp_path / "auto", "--log_level=warn",
                      "--backend=auto", "--gpu_min_output_bytes=1048576")
    cpu = TembServer(SERVER, tmp_path / "cpu", "--log_level=warn",
                     "--backend=cpu")
    try:
        small = v1.EmbedRequest(preset="sdxl", timesteps=TIMESTEPS.tolist())
        large = v1.EmbedRequest(  # 2048 x 1280 fp32: 10 MiB, over 1 MiB
            preset="ldm", spec=v1.EmbeddingSpec(dim=1280),
            timesteps=np.resize(TIMESTEPS, 2048).tolist())
        expected = {}
        with stubs(pb, cuda, cpu) as (gpu_stub, cpu_stub):
            for name, request in (("small", small), ("large", large)):
                for on_gpu, stub in ((True, gpu_stub), (False, cpu_stub)):
                    expected[name, on_gpu] = stub.Embed(
                        request, timeout=30).embedding.data
        routed = {"small": expected["small", False],
                  "large": expected["large", True]}
        # Routing is visible in the bytes only where the backends differ.
        print("large answer differs between backends:",
              expected["large", True] != expected["large", False])
        failures = []
        counts = {"small": 0, "large": 0}
        lock = threading.Lock()
        stop = time.monotonic() + 5

        def client(index):
            with grpc.insecure_channel(auto.target, options=OPTIONS) as ch:
                stub = v1_grpc.EmbeddingServiceStub(ch)
                n = 0
                while time.monotonic() < stop:
                    name = "large" if (n + index) % 4 == 0 else "small"
                    n += 1
                    try:
                        response = stub.Embed(
                            large if name == "large" else small, timeout=30)
                    except grpc.RpcError as error:
                        with lock:
                            failures.append(f"{name}: {error.code()} "
                                            f"{error.details()}")
                        continue
                    with lock:
                        counts[name] += 1
                        if response.embedding.data != routed[name]:
                            failures.append(f"{name}: other bytes")

        threads = [threading.Thread(target=client, args=(i,))
                   for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures[:5]
        assert counts["small"] > 100 and counts["large"] > 20, counts
        print("auto under load:", counts)
        assert auto.alive()
    finally:
        for server in (auto, cuda, cpu):
            server.kill()


def test_sigterm_drains_gpu_calls_in_flight(tmp_path, pb):
    """SIGTERM while large GPU calls are being answered: every admitted call
    completes whole, later ones are refused UNAVAILABLE, the server exits
    0.  Only these calls run, so the in-flight gauge counts them alone.
    The memory budget admits all six (the default 512 MiB would refuse the
    fourth with RESOURCE_EXHAUSTED, which is not what this test is about)."""
    v1, v1_grpc = pb
    server = start_or_skip(tmp_path, "--backend=cuda", "--drain_grace=30s",
                           f"--max_queued_bytes={1 << 30}", metrics=True)
    rows, dim = 16384, 2048  # 128 MiB fp32 per answer
    request = v1.EmbedRequest(preset="ldm", spec=v1.EmbeddingSpec(dim=dim),
                              timesteps=np.resize(TIMESTEPS, rows).tolist())
    try:
        with grpc.insecure_channel(server.target, options=OPTIONS) as channel:
            grpc.channel_ready_future(channel).result(timeout=10)
            stub = v1_grpc.EmbeddingServiceStub(channel)
            first = stub.Embed(request, timeout=60)  # the answer to expect
            server.wait_idle()
            calls = [stub.Embed.future(request, timeout=60) for _ in range(6)]
            assert server.wait_for_call(
                lambda: all(c.done() for c in calls),
                interval=0.005), "all ended first"
            assert server.terminate(timeout=60) == 0, server.log()
            completed = 0
            for call in calls:
                try:
                    response = call.result(timeout=60)
                except grpc.RpcError as error:
                    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
                    continue
                assert response.embedding.data == first.embedding.data
                completed += 1
            assert completed >= 1
    finally:
        server.kill()


def test_bench_against_the_gpu_server_has_no_errors(tmp_path):
    """`temb bench` at concurrency 16 with 1024x1280 answers on the CUDA
    backend: every call OK."""
    server = start_or_skip(tmp_path, "--backend=cuda")
    try:
        result = subprocess.run(
            [str(TEMB), "bench", "--target", server.target, "--duration=3s",
             "--warmup=0.5s", "--concurrency=16", "--batch=1024",
             "--dim=1280", "--flip_sin_to_cos", "--downscale_freq_shift=0",
             "--timeout=60s", "--json"],
            capture_output=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr.decode()
        report = json.loads(result.stdout)
        assert not any(report["errors"].values()), report["errors"]
        assert report["ok"] > 100, report
    finally:
        server.kill()


def test_conditioning_served_on_the_gpu(tmp_path, pb):
    """A conditioning model served with --conditioning_device=cuda, built
    and saved by diffusers: 8 threads asking at once, for rows alone and in
    batches, get the bits `temb condition --device=cuda` computes for the
    whole schedule in one call (rows are batch-invariant; calls share the
    engine's stream one at a time).  Skips without diffusers."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    v1, v1_grpc = pb
    repository = tmp_path / "models"
    torch.manual_seed(0)
    diffusers.QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=3,
        attention_head_dim=64, num_attention_heads=4, joint_attention_dim=24,
        axes_dims_rope=(16, 24, 24)).to(torch.bfloat16).save_pretrained(
            repository / "qwen")
    schedule = [1000.0, 937.5, 871.25, 500.0, 333.0, 41.75, 1.0, 0.0]
    reference = tmp_path / "reference.safetensors"
    done = subprocess.run(
        [str(TEMB), "condition", f"--model_dir={repository / 'qwen'}",
         "--device=cuda", "--timesteps=" + ",".join(map(str, schedule)),
         f"--out={reference}"], capture_output=True, text=True, timeout=120)
    if done.returncode != 0 and not os.environ.get("TEMB_REQUIRE_CUDA"):
        pytest.skip(f"no GPU Linear engine: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert "Linears on cuda:0:cublaslt" in done.stderr, done.stderr
    expected = {name: value.view(torch.int16).numpy()
                for name, value in safetensors_torch.load_file(
                    str(reference)).items()}
    server = start_or_skip(tmp_path, "--backend=cuda",
                           "--conditioning_device=cuda",
                           f"--model_repository={repository}")
    try:
        with grpc.insecure_channel(server.target, options=OPTIONS) as channel:
            stub = v1_grpc.EmbeddingServiceStub(channel)
            for _ in range(600):
                info = stub.GetServerInfo(v1.GetServerInfoRequest())
                states = [m.state for m in info.conditioning_models]
                if states and all(s != v1.MODEL_STATE_LOADING
                                  for s in states):
                    break
                time.sleep(0.1)
            assert states == [v1.MODEL_STATE_READY], info

            def ask(rows):
                timesteps = np.float32([schedule[i] for i in rows])
                request = v1.ConditionRequest(model="qwen", inputs=[
                    v1.NamedTensor(name="timesteps", tensor=v1.Tensor(
                        shape=[len(rows)], dtype=v1.DTYPE_FP32,
                        data=timesteps.tobytes()))])
                response = stub.Condition(request, timeout=60)
                return {out.name: np.frombuffer(
                    out.tensor.data, np.int16).reshape(out.tensor.shape)
                    for out in response.outputs}

            failures = []

            def client(k):
                for call in range(6):
                    first = (k + call) % len(schedule)
                    rows = list(range(first, min(len(schedule),
                                                 first + 1 + call % 3)))
                    got = ask(rows)
                    for name, bits in expected.items():
                        if not np.array_equal(got[name], bits[rows]):
                            failures.append((k, call, name, rows))

            threads = [threading.Thread(target=client, args=(k,))
                       for k in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not failures, failures[:5]
    finally:
        server.kill()
