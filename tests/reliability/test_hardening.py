"""What an outside red team found, each against the real temb-server
(loopback only, every wait bounded): corrupt messages mid-stream, streams
whose client never reads, requests far over the largest valid one, calls
reset before their message, SIGHUP, bad configuration, and control
characters in logged client strings."""
import json
import os
import re
import signal
import subprocess
import threading
import time

import grpc
import pytest

from conftest import SERVER
from h2_flood import large_messages, reset_before_message

EMBED_STREAM = "/temb.v1.EmbeddingService/EmbedStream"
MODEL_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
# Not a protobuf message: a length-delimited field 1 whose length runs past
# the end of the bytes.
GARBAGE = b"\x0a\xff\xff\xff\xff\x0f\x01"
MiB = 1 << 20


def wait_for(predicate, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def small_embed(v1, request_id=""):
    return v1.EmbedRequest(preset="sdxl", timesteps=[1, 2],
                           request_id=request_id)


def kserve_request(kserve, values=(1.0, 2.0)):
    request = kserve.ModelInferRequest(model_name="sdxl", id="k")
    tensor = request.inputs.add(name="TIMESTEP", datatype="FP32")
    tensor.shape.extend([len(values), 1])
    tensor.contents.fp32_contents.extend(values)
    return request


def raw_stream(channel, method, messages, timeout=30):
    """Sends `messages` (bytes, unparsed) on a bidi stream and half-closes;
    returns (answers as bytes, the final RpcError or None)."""
    call = channel.stream_stream(method)(iter(messages), timeout=timeout)
    answers = []
    try:
        for answer in call:
            answers.append(answer)
    except grpc.RpcError as error:
        return answers, error
    return answers, None


# ------------------------------------------------ 4: corrupt stream message


@pytest.mark.parametrize("api", ["native", "kserve"])
def test_corrupt_stream_message_ends_the_stream_with_invalid_argument(
        start_server, pb, api):
    v1, _, kserve, _ = pb
    server = start_server("--backend=cpu")
    if api == "native":
        method = EMBED_STREAM
        good = small_embed(v1).SerializeToString()
        parse = v1.EmbedStreamResponse.FromString
        wanted = "temb.v1.EmbedRequest"
    else:
        method = MODEL_STREAM_INFER
        good = kserve_request(kserve).SerializeToString()
        parse = kserve.ModelStreamInferResponse.FromString
        wanted = "inference.ModelInferRequest"
    with grpc.insecure_channel(server.target) as channel:
        # Two answers, then the stream ends with an error that says why;
        # the request after the garbage is never answered.
        answers, error = raw_stream(channel, method,
                                    [good, good, GARBAGE, good])
        assert len(answers) == 2
        for answer in map(parse, answers):
            if api == "native":
                assert answer.HasField("response"), answer
            else:
                assert not answer.error_message, answer
        assert error is not None, "the stream ended OK after a corrupt message"
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "message 3 of the stream" in error.details(), error.details()
        assert wanted in error.details(), error.details()
        # A plain half-close still ends OK.
        answers, error = raw_stream(channel, method, [good, good])
        assert len(answers) == 2 and error is None, error
        # Garbage first: nothing answered.
        answers, error = raw_stream(channel, method, [GARBAGE])
        assert answers == [] and error is not None
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert server.alive(), server.log()


# --------------------------------------- 3: streams whose client never reads


def test_streams_that_never_read_hold_bytes_not_inflight_slots(
        start_server, pb):
    v1, v1_grpc, _, _ = pb
    # Each answer is 32 MiB, far more than HTTP/2 windows let through to a
    # client that does not read: it waits in gRPC, unsent.  The idle
    # channel keeps its window at the default 64 KiB: with BDP probing on a
    # loaded machine, gRPC grows a window until the whole answer sits in the
    # client's buffers (the answer is then written, and rightly no longer
    # counted), which failed this test under the sanitizers.
    rows, dim = 2048, 4096
    answer_bytes = rows * dim * 4
    limit = 5 * answer_bytes - MiB
    server = start_server("--backend=cpu", "--max_inflight=4",
                          f"--max_queued_bytes={limit}")
    assert server.metric("temb_queued_bytes_limit") == limit
    assert server.metric("temb_queued_bytes") == 0
    big = v1.EmbedRequest(preset="ldm", spec=v1.EmbeddingSpec(dim=dim),
                          timesteps=[i % 1000 for i in range(rows)])
    options = [("grpc.max_receive_message_length", 256 * MiB)]
    with grpc.insecure_channel(
            server.target,
            options=options + [("grpc.http2.bdp_probe", 0)]) as idle, \
            grpc.insecure_channel(
                server.target,
                options=options + [("grpc.use_local_subchannel_pool", 1)]
            ) as other:
        stub = v1_grpc.EmbeddingServiceStub(idle)
        streams = [stub.EmbedStream(iter([big]), timeout=120)
                   for _ in range(4)]  # never read
        try:
            wait_for(lambda: server.metric("temb_requests_total",
                                           method="EmbedStream",
                                           code="OK") == 4,
                     what="the four answers to be computed")
            # Their answers are computed: no call is being worked on...
            assert server.metric("temb_inflight_requests") == 0
            # ...so every other caller still gets in (before the fix the four
            # unsent answers held all four slots: RESOURCE_EXHAUSTED).
            other_stub = v1_grpc.EmbeddingServiceStub(other)
            for _ in range(8):
                response = other_stub.Embed(small_embed(v1), timeout=30)
                assert list(response.embedding.shape) == [2, 320]
            # The unsent answers still count in max_queued_bytes (their
            # requests' bytes too)...
            held = server.metric("temb_queued_bytes")
            assert 4 * answer_bytes < held < limit, held
            # ...so a fifth big answer does not fit beside them.
            with pytest.raises(grpc.RpcError) as refused:
                other_stub.Embed(big, timeout=30)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_queued_bytes" in refused.value.details()
        finally:
            for call in streams:
                call.cancel()
        # Once the streams are gone, so are their bytes.
        wait_for(lambda: _embeds(other, v1, v1_grpc, big), timeout=60,
                 what="the bytes of the cancelled streams to be released")
        assert server.metric("temb_queued_bytes") == 0
    assert server.alive(), server.log()


def _embeds(channel, v1, v1_grpc, request):
    try:
        v1_grpc.EmbeddingServiceStub(channel).Embed(request, timeout=30)
        return True
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
        return False


# ----------------------------------------------- 2: requests far too large


def test_request_over_the_largest_valid_one_is_refused(start_server, pb):
    v1, v1_grpc, _, _ = pb
    server = start_server("--backend=cpu")
    with grpc.insecure_channel(server.target) as channel:
        stub = v1_grpc.EmbeddingServiceStub(channel)
        info = stub.GetServerInfo(v1.GetServerInfoRequest(), timeout=10)
        # Within max_batch and max_output_bytes, but 2 MiB of request id:
        # no valid request is that large (max_batch timesteps at 10 bytes
        # each + 64 KiB), so gRPC refuses it before any handler runs.
        bloated = small_embed(v1, request_id="x" * (2 * MiB))
        with pytest.raises(grpc.RpcError) as e:
            stub.Embed(bloated, timeout=30)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # The largest valid request still fits: max_batch negative integer
        # timesteps (10 bytes each), dim 1, fp16.
        largest = v1.EmbedRequest(
            preset="ldm", spec=v1.EmbeddingSpec(dim=2), dtype=2,
            integer_timesteps=[-(1 << 62)] * info.limits.max_batch,
            request_id="y" * 1000)
        response = stub.Embed(largest, timeout=60)
        assert list(response.embedding.shape) == [info.limits.max_batch, 2]
    # The log names both limits.
    assert server.alive()


def test_concurrent_large_requests_keep_rss_bounded(start_server):
    quota = 64 * MiB
    server = start_server("--backend=cpu", f"--grpc_memory_quota={quota}")
    before = server.rss_bytes()
    peak = [before]
    sampling = threading.Event()

    def sample():
        while not sampling.is_set():
            peak[0] = max(peak[0], server.rss_bytes())
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    results = []
    try:
        # 4 connections x 4 calls, each sending one 128 MiB message: 2 GiB
        # that gRPC 1.51 would buffer whole before checking any limit.
        senders = [threading.Thread(target=lambda: results.append(
            large_messages("127.0.0.1", server.port, 4, 128 * MiB,
                           timeout=60))) for _ in range(4)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(timeout=90)
    finally:
        sampling.set()
        sampler.join()
    statuses = [s for r in results for s in r["status"] if s is not None]
    # Every call that got an answer was refused as too large; the others
    # were reset by gRPC when its memory quota ran out.
    assert all(s == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
               for s in statuses), statuses
    assert sum(r["sent"] for r in results) > 128 * MiB, results
    # docs/operations.md: what connections hold is at most ~3 x the quota.
    # Under AddressSanitizer (scripts/sanitize.sh sets ASAN_OPTIONS) freed
    # memory waits in ASan's quarantine, so RSS says nothing about the bound:
    # the plain build's run of this test measures it.
    if "ASAN_OPTIONS" not in os.environ:
        assert peak[0] - before < 3 * quota + 32 * MiB, (before, peak[0])
    assert server.alive(), server.log()
    with grpc.insecure_channel(server.target) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)


# ------------------------------------------- 7: reset before the message


def test_calls_reset_before_their_message_count_as_cancelled(start_server):
    server = start_server("--backend=cpu")
    for path in ("/temb.v1.EmbeddingService/Embed",
                 "/inference.GRPCInferenceService/ModelInfer"):
        reset_before_message("127.0.0.1", server.port, 2000, path=path)
    method_of = {"Embed": 0, "ModelInfer": 0}

    def settled():
        finished = {m: server.metric("temb_requests_total", method=m)
                    for m in method_of}
        done = finished == method_of
        method_of.update(finished)
        return done and server.metric("temb_inflight_requests") == 0

    time.sleep(0.5)
    wait_for(settled, what="the reset calls to finish")
    for method in method_of:
        invalid = server.metric("temb_requests_total", method=method,
                                code="INVALID_ARGUMENT")
        cancelled = server.metric("temb_requests_total", method=method,
                                  code="CANCELLED")
        assert invalid == 0, (method, invalid, cancelled)
    assert server.alive(), server.log()


# ----------------------------------------------------------- 8: SIGHUP


def test_sighup_drains_like_sigterm(start_server, pb):
    v1, v1_grpc, _, _ = pb
    server = start_server("--backend=cpu", "--cpu_threads=1",
                          "--drain_grace=60s", "--log_level=info")
    big = v1.EmbedRequest(preset="ldm",
                          spec=v1.EmbeddingSpec(dim=512, precision=2),
                          dtype=2, timesteps=[i % 1000 for i in range(32768)])
    options = [("grpc.max_receive_message_length", 256 * MiB)]
    with grpc.insecure_channel(server.target, options=options) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        stub = v1_grpc.EmbeddingServiceStub(channel)
        call = server.call_in_flight(
            lambda: stub.Embed.future(big, timeout=120))
        server.process.send_signal(signal.SIGHUP)
        # The call in flight is answered, not cut off.
        response = call.result(timeout=120)
    assert list(response.embedding.shape) == [32768, 512]
    assert server.process.wait(timeout=60) == 0, server.log()
    log = server.log()
    assert re.search(r"event=signal signal=Hangup .*action=drain", log), log
    assert "event=drained" in log, log


# ------------------------------------------------ 9: bad configuration


def _start(tmp_path, *flags):
    """Runs temb-server with `flags`; it must refuse them and exit within
    15 s.  A server that starts anyway is killed and fails the test."""
    process = subprocess.Popen(
        [str(SERVER), "--address=127.0.0.1:0", "--metrics_address=",
         "--backend=cpu", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=tmp_path)
    try:
        _, stderr = process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate(timeout=10)
        pytest.fail(f"temb-server started with {flags}:\n{stderr}")
    return subprocess.CompletedProcess(process.args, process.returncode, "",
                                       stderr)


@pytest.mark.parametrize("flags,named", [
    (["--address=127.0.0.1:99999"], "--address"),
    (["--address=127.0.0.1"], "--address"),
    (["--metrics_address=127.0.0.1:70000"], "--metrics_address"),
    (["--drain_grace=-1s"], "--drain_grace"),
    (["--drain_grace=inf"], "--drain_grace"),
    (["--cpu_threads=-1"], "--cpu_threads"),
    (["--cpu_threads=100000000"], "--cpu_threads"),
    (["--max_batch=0"], "--max_batch"),
    (["--max_batch=9000000000000000000"], "--max_batch"),
    (["--max_output_bytes=9000000000000000000"], "--max_output_bytes"),
    (["--max_dim=0"], "--max_dim"),
    (["--max_inflight=-1"], "--max_inflight"),
    (["--max_queued_bytes=-5"], "--max_queued_bytes"),
    (["--gpu_min_output_bytes=-1"], "--gpu_min_output_bytes"),
    (["--grpc_memory_quota=1000"], "--grpc_memory_quota"),
    # What answered UNIMPLEMENTED with no message (std::bad_alloc in a
    # handler): a 64 GB output allowed by the flags.
    (["--max_output_bytes=9000000000000000000", "--max_dim=2000000000",
      "--max_queued_bytes=0"], "--max_output_bytes"),
])
def test_bad_configuration_is_refused_naming_the_flag(tmp_path, flags, named):
    started = _start(tmp_path, *flags)
    assert started.returncode == 1, (flags, started.stderr)
    assert "startup_failed" in started.stderr, started.stderr
    assert named in started.stderr, started.stderr


def test_presets_file_is_checked_against_the_servers_limits(tmp_path):
    (tmp_path / "empty.textproto").write_text("# nothing here\n")
    started = _start(tmp_path, f"--presets_file={tmp_path / 'empty.textproto'}")
    assert started.returncode == 1, started.stderr
    assert "--presets_file" in started.stderr
    assert "defines no preset" in started.stderr, started.stderr
    (tmp_path / "wide.textproto").write_text(
        'presets { name: "wide" description: "Source: test" spec { dim: 512 '
        'flip_sin_to_cos: true downscale_freq_shift: 0 } }\n')
    started = _start(tmp_path, "--max_dim=256",
                     f"--presets_file={tmp_path / 'wide.textproto'}")
    assert started.returncode == 1, started.stderr
    assert "wide" in started.stderr and "256" in started.stderr, \
        started.stderr


def test_edge_values_still_start(tmp_path, start_server, pb):
    v1, v1_grpc, _, _ = pb
    (tmp_path / "wide.textproto").write_text(
        'presets { name: "wide" description: "Source: test" spec { dim: 512 '
        'flip_sin_to_cos: true downscale_freq_shift: 0 } }\n')
    server = start_server("--backend=cpu", "--drain_grace=0s",
                          "--cpu_threads=0", "--max_dim=512",
                          "--grpc_memory_quota=0",
                          f"--presets_file={tmp_path / 'wide.textproto'}")
    with grpc.insecure_channel(server.target) as channel:
        response = v1_grpc.EmbeddingServiceStub(channel).Embed(
            v1.EmbedRequest(preset="wide", timesteps=[1]), timeout=30)
    assert list(response.embedding.shape) == [1, 512]


# ------------------------------------- 11: control characters in the log

# CR, ESC (a terminal escape), DEL and U+0085 (a C1 line break).
HOSTILE_IDS = ["a\rFAKE\x1b[31mred", "b\x7fdel\u0085next"]


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_logged_client_strings_have_no_control_characters(start_server, pb,
                                                          log_format):
    v1, v1_grpc, _, _ = pb
    server = start_server("--backend=cpu", "--log_level=debug",
                          f"--log_format={log_format}")
    with grpc.insecure_channel(server.target) as channel:
        stub = v1_grpc.EmbeddingServiceStub(channel)
        for request_id in HOSTILE_IDS:
            stub.Embed(small_embed(v1, request_id), timeout=30)
            with pytest.raises(grpc.RpcError):  # logged with its error
                stub.Embed(v1.EmbedRequest(preset=request_id, timesteps=[1],
                                           request_id=request_id),
                           timeout=30)
    server.stop()
    raw = server.log_path.read_bytes()
    for forbidden in (b"\r", b"\x1b", b"\x7f", "\u0085".encode()):
        assert forbidden not in raw, (forbidden, raw[-2000:])
    lines = raw.decode("ascii").splitlines()  # every byte is ASCII
    requests = [line for line in lines if "request" in line and
                ("FAKE" in line or "del" in line)]
    assert len(requests) >= 4, lines
    if log_format == "json":
        # The escapes decode back to exactly what the client sent.
        ids = {json.loads(line)["request_id"] for line in requests}
        assert ids == set(HOSTILE_IDS), ids
    else:
        assert r"a\rFAKE\u001b[31mred" in raw.decode(), raw[-2000:]
