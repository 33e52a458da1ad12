"""A catalogue of bad inputs sent to the real server: each gets the right
gRPC code and a message naming the problem, and the server stays SERVING.

Most cases go through `temb embed --target` (flags); the rest are raw
requests that the CLI cannot express.
"""
import grpc
import pytest

from conftest import temb

EXPLICIT = ["--flip_sin_to_cos", "--downscale_freq_shift=0"]

# (id, flags, expected code, substring of the message)
FLAG_CASES = [
    ("dim-zero", ["--dim=0", *EXPLICIT], "INVALID_ARGUMENT",
     "dim must be in [1, 16384], got 0"),
    ("dim-negative", ["--dim=-3", *EXPLICIT], "INVALID_ARGUMENT", "got -3"),
    ("dim-over-limit", ["--dim=16386", *EXPLICIT], "RESOURCE_EXHAUSTED",
     "dim must be in [1, 16384]"),
    ("no-convention", ["--dim=8"], "INVALID_ARGUMENT",
     "missing: flip_sin_to_cos, downscale_freq_shift"),
    ("no-shift", ["--dim=8", "--flip_sin_to_cos"], "INVALID_ARGUMENT",
     "missing: downscale_freq_shift"),
    ("no-dim", EXPLICIT, "INVALID_ARGUMENT", "missing: dim"),
    ("unknown-preset", ["--preset=sd99"], "NOT_FOUND", 'unknown preset "sd99"'),
    ("preset-fixed-dim", ["--preset=sd15", "--dim=8"], "INVALID_ARGUMENT",
     "fixed dim of 320"),
    ("preset-max-period", ["--preset=sd15", "--max_period=100"],
     "INVALID_ARGUMENT", "max_period cannot be set together with preset"),
    ("preset-flip", ["--preset=flux", "--noflip_sin_to_cos"],
     "INVALID_ARGUMENT", "flip_sin_to_cos cannot be set"),
    ("preset-layout", ["--preset=sdxl", "--layout=interleaved"],
     "INVALID_ARGUMENT", "layout cannot be set"),
    ("preset-time-factor", ["--preset=dit", "--time_factor=1000"],
     "INVALID_ARGUMENT", "time_factor cannot be set"),
    ("preset-without-dim", ["--preset=ldm"], "INVALID_ARGUMENT",
     "has no default dim"),
    ("max-period-zero", ["--dim=8", *EXPLICIT, "--max_period=0"],
     "INVALID_ARGUMENT", "max_period must be finite and > 0"),
    ("max-period-negative", ["--dim=8", *EXPLICIT, "--max_period=-5"],
     "INVALID_ARGUMENT", "max_period must be finite and > 0"),
    ("max-period-inf", ["--dim=8", *EXPLICIT, "--max_period=inf"],
     "INVALID_ARGUMENT", "max_period must be finite"),
    ("scale-nan", ["--dim=8", *EXPLICIT, "--scale=nan"], "INVALID_ARGUMENT",
     "scale must be finite"),
    ("time-factor-inf", ["--dim=8", *EXPLICIT, "--time_factor=inf"],
     "INVALID_ARGUMENT", "time_factor must be finite"),
    ("shift-nan", ["--dim=8", "--flip_sin_to_cos", "--downscale_freq_shift=nan"],
     "INVALID_ARGUMENT", "downscale_freq_shift must be finite"),
    ("zero-divisor-dim2", ["--dim=2", "--flip_sin_to_cos",
                           "--downscale_freq_shift=1"],
     "INVALID_ARGUMENT", "dim / 2 - downscale_freq_shift must be non-zero"),
    ("zero-divisor-dim3", ["--dim=3", "--noflip_sin_to_cos",
                           "--downscale_freq_shift=1"],
     "INVALID_ARGUMENT", "dim=3 downscale_freq_shift=1"),
    ("frequency-overflow", ["--dim=16", "--flip_sin_to_cos",
                            "--downscale_freq_shift=8.5"],
     "INVALID_ARGUMENT", "frequencies overflow"),
    ("interleaved-odd", ["--dim=7", *EXPLICIT, "--layout=interleaved"],
     "INVALID_ARGUMENT", "dim must be even with layout=interleaved"),
    ("timestep-nan", ["--preset=sd15", "--timesteps=1,nan"],
     "INVALID_ARGUMENT", "timesteps[1] must be finite"),
    ("timestep-inf", ["--preset=sd15", "--timesteps=0,1,inf"],
     "INVALID_ARGUMENT", "timesteps[2] must be finite"),
    ("timestep-minus-inf", ["--preset=flux", "--timesteps=-inf"],
     "INVALID_ARGUMENT", "timesteps[0] must be finite"),
    ("angle-overflow", ["--dim=8", *EXPLICIT, "--time_factor=1e30",
                        "--timesteps=5,1e10"],
     "INVALID_ARGUMENT", "timesteps[1] = "),
    ("repeat-only-fp16-range", ["--dim=4", *EXPLICIT, "--repeat_only",
                                "--dtype=fp16", "--timesteps=70000"],
     "INVALID_ARGUMENT", "not representable in dtype fp16"),
    # gRPC keeps deadlines in whole milliseconds, so a 1 us one let a quick
    # call finish in time now and then: a call that computes for tens of
    # milliseconds (8192 rows in float64) against 1 ms cannot.
    ("deadline", ["--preset=sd15", "--precision=fp64", "--timeout=1ms",
                  "--max_attempts=1",
                  "--timesteps=" + ",".join(str(i % 1000)
                                            for i in range(8192))],
     "DEADLINE_EXCEEDED", "Deadline"),
    # A 12 KB name is echoed cut short: the trailer stays under the client's
    # metadata limit, so the client sees NOT_FOUND, not RESOURCE_EXHAUSTED.
    ("huge-preset-name", ["--preset=" + "p" * 12000],
     "NOT_FOUND", "...\" (12000 bytes)"),
    ("control-bytes-in-name", ["--preset=a\x1b[31mb"],
     "NOT_FOUND", "\"a\\x1b[31mb\""),
]

# Cases for a server started with small limits.
LIMIT_FLAGS = ["--max_batch=100", "--max_output_bytes=65536", "--max_dim=1024"]
LIMIT_CASES = [
    ("batch-limit", ["--preset=sd15", "--timesteps=" + ",".join(["1"] * 101)],
     "RESOURCE_EXHAUSTED", "must be <= 100, got 101"),
    ("output-limit", ["--preset=sd15", "--timesteps=" + ",".join(["1"] * 60)],
     "RESOURCE_EXHAUSTED", "output size"),
    ("dim-limit", ["--dim=2048", *EXPLICIT], "RESOURCE_EXHAUSTED",
     "dim must be in [1, 1024], got 2048"),
]


def check_error(target, flags, code, substring):
    if not any(f.startswith("--timesteps") for f in flags):
        flags = [*flags, "--timesteps=1,2"]
    result = temb("embed", "--target", target, *flags)
    stderr = result.stderr.decode()
    assert result.returncode == 1, stderr
    assert result.stdout == b""
    assert stderr.startswith(f"error: {code}: "), stderr
    assert substring in stderr, stderr


@pytest.mark.parametrize("flags,code,substring",
                         [c[1:] for c in FLAG_CASES],
                         ids=[c[0] for c in FLAG_CASES])
def test_flag_case(server, flags, code, substring):
    check_error(server.target, flags, code, substring)


def test_limit_cases(start_server):
    limited = start_server(*LIMIT_FLAGS)
    for _, flags, code, substring in LIMIT_CASES:
        check_error(limited.target, flags, code, substring)
    assert temb("health", "--target", limited.target).returncode == 0


def raw_cases(pb):
    v1 = pb[0]
    explicit = v1.EmbeddingSpec(dim=8, flip_sin_to_cos=True,
                                downscale_freq_shift=0)
    return [
        ("both-timestep-kinds",
         v1.EmbedRequest(spec=explicit, timesteps=[1], integer_timesteps=[2]),
         grpc.StatusCode.INVALID_ARGUMENT,
         "set either timesteps or integer_timesteps"),
        ("unknown-dtype", v1.EmbedRequest(spec=explicit, timesteps=[1], dtype=9),
         grpc.StatusCode.INVALID_ARGUMENT, "unknown enum value 9"),
        ("unknown-layout",
         v1.EmbedRequest(spec=v1.EmbeddingSpec(dim=8, flip_sin_to_cos=True,
                                               downscale_freq_shift=0,
                                               layout=5), timesteps=[1]),
         grpc.StatusCode.INVALID_ARGUMENT, "layout"),
        ("unknown-precision",
         v1.EmbedRequest(spec=v1.EmbeddingSpec(dim=8, flip_sin_to_cos=True,
                                               downscale_freq_shift=0,
                                               precision=7), timesteps=[1]),
         grpc.StatusCode.INVALID_ARGUMENT, "precision"),
        ("preset-and-repeat-only",
         v1.EmbedRequest(preset="sd15", spec=v1.EmbeddingSpec(repeat_only=False),
                         timesteps=[1]),
         grpc.StatusCode.INVALID_ARGUMENT, "repeat_only cannot be set"),
        ("empty-request", v1.EmbedRequest(), grpc.StatusCode.INVALID_ARGUMENT,
         "missing: dim, flip_sin_to_cos, downscale_freq_shift"),
    ]


def test_raw_requests(server, pb):
    v1, v1_grpc = pb
    with grpc.insecure_channel(server.target) as channel:
        stub = v1_grpc.EmbeddingServiceStub(channel)
        for name, request, code, substring in raw_cases(pb):
            with pytest.raises(grpc.RpcError) as info:
                stub.Embed(request, timeout=10)
            assert info.value.code() == code, name
            assert substring in info.value.details(), (name, info.value.details())
        # On a stream the same errors come back per request, in order, and
        # the stream goes on.
        requests = [request for _, request, _, _ in raw_cases(pb)]
        requests.insert(2, v1.EmbedRequest(preset="sd15", timesteps=[3],
                                           request_id="good"))
        answers = list(stub.EmbedStream(iter(requests), timeout=10))
        assert len(answers) == len(requests)
        assert answers[2].WhichOneof("result") == "response"
        assert answers[2].request_id == "good"
        codes = [a.error.code for i, a in enumerate(answers) if i != 2]
        assert codes == [c.value[0] for _, _, c, _ in raw_cases(pb)]


def test_cli_usage_errors(server):
    for flags in (["--bogus"], ["--layout=diagonal", "--preset=sd15"],
                  ["--dim=abc"], ["--local"], ["--preset=sd15"],
                  ["--format=xml", "--preset=sd15", "--timesteps=1"]):
        target = [] if "--local" in flags else ["--target", server.target]
        if "--local" in flags:
            flags = [*flags, "--target", server.target, "--timesteps=1"]
        result = temb("embed", *target, *flags)
        assert result.returncode == 2, (flags, result.stderr)
        assert result.stderr.startswith(b"usage error: ")


def test_server_still_serving_after_catalogue(server):
    # Runs last in this module: the whole catalogue hit this server.
    result = temb("health", "--target", server.target)
    assert result.returncode == 0 and result.stdout.strip() == b"SERVING"
    good = temb("embed", "--target", server.target, "--preset=sd15",
                "--timesteps=1")
    assert good.returncode == 0


def test_garbage_bytes_get_invalid_argument_on_every_unary_method(server):
    # Bytes that are no protobuf message (a truncated varint): every unary
    # method answers INVALID_ARGUMENT naming the message type, and the server
    # keeps serving.
    garbage = b"\x08\xff\xff\xff"
    with grpc.insecure_channel(server.target) as channel:
        for method, message in (("Embed", "temb.v1.EmbedRequest"),
                                ("GetServerInfo",
                                 "temb.v1.GetServerInfoRequest")):
            call = channel.unary_unary(f"/temb.v1.EmbeddingService/{method}")
            with pytest.raises(grpc.RpcError) as info:
                call(garbage, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
            assert message in info.value.details(), info.value.details()
    result = temb("embed", "--target", server.target, "--preset=sd15",
                  "--timesteps=1")
    assert result.returncode == 0


def test_echoed_text_and_parts_are_bounded(start_server, pb):
    # Everything an answer echoes is bounded, so that every answer the limits
    # admit also fits the message limit: no answer is computed and then fails
    # to send.
    v1, v1_grpc = pb
    server = start_server("--max_output_bytes=65536")
    with grpc.insecure_channel(server.target) as channel:
        stub = v1_grpc.EmbeddingServiceStub(channel)
        cases = [
            (v1.EmbedRequest(preset="sd15", timesteps=[1],
                             request_id="r" * 1025),
             grpc.StatusCode.INVALID_ARGUMENT,
             "request_id must be at most 1024 bytes, got 1025"),
            (v1.EmbedRequest(preset="flux", parts=[
                v1.EmbedPart(name="timestep", timesteps=[1])] * 65),
             grpc.StatusCode.INVALID_ARGUMENT, "parts must hold at most 64"),
            (v1.EmbedRequest(preset="flux", parts=[
                v1.EmbedPart(name="g" * 257, timesteps=[1])]),
             grpc.StatusCode.INVALID_ARGUMENT,
             "parts[0].name must be at most 256 bytes"),
            # 40 + 40 rows of 256 fp32 = 2 x 40 KiB: each part fits 64 KiB,
            # the two together do not.
            (v1.EmbedRequest(preset="flux", parts=[
                v1.EmbedPart(name="timestep", timesteps=[0.5] * 40),
                v1.EmbedPart(name="guidance", timesteps=[3.5] * 40)]),
             grpc.StatusCode.RESOURCE_EXHAUSTED,
             "the parts' outputs together must be <= 65536 bytes"),
        ]
        for request, code, substring in cases:
            with pytest.raises(grpc.RpcError) as info:
                stub.Embed(request, timeout=10)
            assert info.value.code() == code, substring
            assert substring in info.value.details(), info.value.details()
        ok = stub.Embed(v1.EmbedRequest(preset="flux", parts=[
            v1.EmbedPart(name="timestep", timesteps=[0.5] * 30),
            v1.EmbedPart(name="guidance", timesteps=[3.5] * 30)]), timeout=10)
        assert [p.name for p in ok.parts] == ["timestep", "guidance"]
        assert list(ok.parts[1].tensor.shape) == [30, 256]
