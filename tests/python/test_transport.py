"""temb.Client's two transports against the real server: grpcio and the
native one (client/transport, gRPC's C++ library) give the same bytes for
every kind of call and the same errors; the prepared-request cache sends
what a whole request would; the choice of transport and its fallbacks.

The native tests skip when the build has no Python extensions (sanitized
builds, TEMB_BUILD_PYTHON_EXTENSION=OFF).
"""

import asyncio
import os
import socket
import subprocess
import sys
import threading
import warnings

import grpc
import numpy as np
import pytest

import temb
from temb import _request, _transport
from temb._proto.temb.v1 import temb_pb2 as pb

LDM = dict(flip_sin_to_cos=True, downscale_freq_shift=0.0)


def _native_available():
    try:
        _transport._extension()
    except ImportError:
        return False
    return True


needs_native = pytest.mark.skipif(not _native_available(),
                                  reason="no _temb_transport extension built")


@pytest.fixture(scope="module")
def clients(server):
    if not _native_available():
        pytest.skip("no _temb_transport extension built")
    with temb.Client(server.target, timeout=60, transport="grpcio") as g, \
            temb.Client(server.target, timeout=60, transport="native") as n:
        assert (g.transport, n.transport) == ("grpcio", "native")
        yield g, n


def _same(a, b):
    if isinstance(a, dict):
        assert list(a) == list(b)
        for name in a:
            _same(a[name], b[name])
        return
    assert type(a) is type(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


CALLS = {
    "preset": lambda c: c.embed([0.0, 1.0, 999.0], preset="sdxl"),
    "scalar": lambda c: c.embed(np.float32(17.5), dim=8, **LDM),
    "shaped [2, 7]": lambda c: c.embed(
        np.arange(14, dtype=np.float32).reshape(2, 7) * 37, dim=64, **LDM),
    "rank 5": lambda c: c.embed(np.ones((1, 2, 1, 3, 1), np.float32),
                                dim=16, **LDM),
    "integers": lambda c: c.embed([1, 2, 1 << 40], dim=32, **LDM),
    "empty": lambda c: c.embed(np.zeros(0, np.float32), dim=8, **LDM),
    "fp16": lambda c: c.embed([250.25], preset="sd3", dtype="fp16"),
    "bf16 bits": lambda c: c.embed([250.25], preset="flux", dtype="bf16",
                                   bf16_format="bits"),
    "bf16 float32": lambda c: c.embed([250.25], preset="flux", dtype="bf16",
                                      bf16_format="float32"),
    "fp64": lambda c: c.embed([3.0], preset="wan", dtype="fp64"),
    "timestep_dtype": lambda c: c.embed([0.8929], preset="flux",
                                        timestep_dtype="bf16"),
    "frequencies (not cached)": lambda c: c.embed(
        [2.0], dim=4, frequencies=[1.0, 0.5], **LDM),
    "parts": lambda c: c.embed_parts({"timestep": [0.5], "guidance": [3.5]},
                                     preset="flux"),
    "parts via embed": lambda c: c.embed(
        parts={"t": {"timesteps": [1.0], "preset": "sdxl"}}),
    "request_id": lambda c: c.embed([5.0], preset="sdxl", request_id="r-1"),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_both_transports_give_the_same_bytes(clients, name):
    grpcio_client, native_client = clients
    call = CALLS[name]
    first = call(grpcio_client)
    _same(first, call(native_client))
    # Second calls take the prepared-request path where one applies.
    _same(first, call(native_client))
    _same(first, call(grpcio_client))


def test_torch_tensors_both_ways(clients):
    torch = pytest.importorskip("torch")
    grpcio_client, native_client = clients
    t = torch.tensor([[1.0, 2.5], [999.0, 0.0]], dtype=torch.float64)
    a = grpcio_client.embed(t, preset="sd15", return_tensors="pt")
    b = native_client.embed(t, preset="sd15", return_tensors="pt")
    assert a.shape == (2, 2, 320) and torch.equal(a, b)
    c = native_client.embed(t, preset="flux", dtype="bf16",
                            return_tensors="pt")
    assert c.dtype == torch.bfloat16
    assert torch.equal(c, grpcio_client.embed(t, preset="flux", dtype="bf16",
                                              return_tensors="pt"))


ERRORS = {
    "bad dim": (lambda c: c.embed([1.0], dim=0, **LDM),
                temb.InvalidArgumentError),
    "no convention": (lambda c: c.embed([1.0], dim=8),
                      temb.InvalidArgumentError),
    "unknown preset": (lambda c: c.embed([1.0], preset="no-such-model"),
                       temb.NotFoundError),
    "nan timestep": (lambda c: c.embed([1.0, float("nan")], preset="sdxl"),
                     temb.InvalidArgumentError),
    "unknown part preset": (lambda c: c.embed_parts(
        {"x": {"timesteps": [1.0], "preset": "nope"}}), temb.NotFoundError),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_both_transports_raise_the_same_errors(clients, name):
    call, error = ERRORS[name]
    raised = []
    for client in clients:
        for _ in range(2):  # the second call is a prepared one
            with pytest.raises(error) as e:
                call(client)
            raised.append((type(e.value), e.value.code, e.value.details))
    assert len(set(raised)) == 1, raised


def test_request_id_comes_back_on_errors(clients):
    for client in clients:
        with pytest.raises(temb.InvalidArgumentError) as e:
            client.embed([1.0], dim=0, request_id="trace-7", **LDM)
        assert e.value.request_id == "trace-7"


def test_deadline_and_unreachable_server():
    if not _native_available():
        pytest.skip("no _temb_transport extension built")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for transport in ("grpcio", "native"):
        with temb.Client(f"127.0.0.1:{port}", retries=0, timeout=20,
                         transport=transport) as c:
            with pytest.raises(temb.UnavailableError) as e:
                c.embed([1.0], dim=8, **LDM)
            assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_expired_deadline(clients):
    for client in clients:
        with pytest.raises(temb.DeadlineExceededError):
            client.embed(np.zeros(4096, np.float32), dim=4096, timeout=1e-6,
                         **LDM)


def test_client_message_limit_applies_to_both(server):
    if not _native_available():
        pytest.skip("no _temb_transport extension built")
    for transport in ("grpcio", "native"):
        with temb.Client(server.target, max_message_bytes=4096, retries=0,
                         transport=transport) as c:
            assert c.embed([1.0], dim=8, **LDM).shape == (1, 8)
            with pytest.raises(temb.ResourceExhaustedError):
                c.embed(np.zeros(64, np.float32), dim=64, **LDM)


def test_threads_share_a_native_client(clients):
    grpcio_client, native_client = clients
    expected = {n: grpcio_client.embed(np.arange(n, dtype=np.float32), dim=32,
                                       **LDM) for n in range(1, 9)}
    failures = []

    def work(n):
        for _ in range(20):
            got = native_client.embed(np.arange(n, dtype=np.float32), dim=32,
                                      **LDM)
            if not np.array_equal(got, expected[n]):
                failures.append(n)

    threads = [threading.Thread(target=work, args=(n,)) for n in expected]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_embed_function_is_embed_with_the_request_encoded_once(clients):
    """Client.embed_function: for 1-D float32 timesteps (numpy or a CPU
    tensor, a negated view included) what embed() returns and raises;
    None on grpcio; the arguments it cannot take are refused."""
    grpcio_client, native_client = clients
    assert grpcio_client.embed_function(preset="sdxl") is None
    t = np.float32([0.0, 250.25, 999.0])
    for arguments in (dict(preset="sdxl"), dict(dim=7, **LDM),
                      dict(preset="flux", dtype="bf16", bf16_format="bits"),
                      dict(preset="wan", dtype="fp64", timeout=30)):
        embed = native_client.embed_function(**arguments)
        _same(embed(t), grpcio_client.embed(t, **arguments))
        _same(embed(t[:1]), grpcio_client.embed(t[:1], **arguments))
    bad = native_client.embed_function(dim=0, **LDM)
    with pytest.raises(temb.InvalidArgumentError, match="dim"):
        bad(t)
    for refused in (dict(request_id="r-1"), dict(parts={"t": [1.0]}),
                    dict(timesteps=t)):
        with pytest.raises(TypeError, match="timesteps, parts and request_id"):
            native_client.embed_function(preset="sdxl", **refused)
    try:
        import torch
    except ImportError:
        return
    embed = native_client.embed_function(preset="sd3", return_tensors="pt")
    tensor = torch.from_numpy(t)
    want = grpcio_client.embed(t, preset="sd3", return_tensors="pt")
    assert torch.equal(embed(tensor), want)
    assert torch.equal(embed(torch._neg_view(-tensor)), want)


def test_prepared_request_is_the_whole_request():
    plans = _request.EmbedPlans()
    cases = [((np.array([1.0, 2.0], np.float32),), dict(preset="sdxl")),
             ((np.arange(6).reshape(2, 3),), dict(dim=8, **LDM)),
             ((np.float32(3.0),), dict(preset="flux", dtype="bf16",
                                       request_id="id-9"))]
    for args, kwargs in cases:
        whole = _request.embed_call(*args, **kwargs).request
        plans.prepare(args, kwargs)  # the first call fills the cache
        prepared = plans.prepare(args, kwargs)
        assert prepared.timesteps is not None
        merged = pb.EmbedRequest.FromString(prepared.request_bytes())
        assert merged == whole


def test_native_module_agrees_with_the_proto_field_numbers():
    if not _native_available():
        pytest.skip("no _temb_transport extension built")
    module = _transport._extension()
    for name, number in module.FIELDS.items():
        message, field = name.split(".")
        descriptor = getattr(pb, message).DESCRIPTOR.fields_by_name[field]
        assert descriptor.number == number, name
    for name, value in module.DTYPES.items():
        assert pb.DType.Value(name) == value, name


def test_transport_choice(server, monkeypatch):
    with pytest.raises(ValueError, match="transport"):
        temb.Client(server.target, transport="carrier-pigeon")
    with temb.Client(server.target, transport="grpcio") as c:
        assert c.transport == "grpcio"
    monkeypatch.setenv("TEMB_TRANSPORT", "grpcio")
    with temb.Client(server.target) as c:
        assert c.transport == "grpcio"
    monkeypatch.setenv("TEMB_TRANSPORT", "bogus")
    with pytest.raises(ValueError, match="TEMB_TRANSPORT"):
        temb.Client(server.target)
    monkeypatch.delenv("TEMB_TRANSPORT")
    with temb.Client(server.target) as c:
        assert c.transport == ("native" if _native_available() else "grpcio")
    # Ready-made grpcio credentials cannot be handed to the C++ library.
    credentials = grpc.ssl_channel_credentials()
    with temb.Client(server.target, tls=credentials) as c:
        assert c.transport == "grpcio"
    with pytest.raises(ValueError, match="ChannelCredentials"):
        temb.Client(server.target, tls=credentials, transport="native")


# --- the asyncio client's two transports ---------------------------------------

class _Blocking:
    """A temb.aio.Client driven from synchronous test code, on one loop (its
    channel belongs to the loop that created it)."""

    def __init__(self, loop, target, **kwargs):
        self.loop = loop

        async def make():
            return temb.aio.Client(target, timeout=60, **kwargs)
        self.client = loop.run_until_complete(make())
        self.transport = self.client.transport

    def embed(self, *args, **kwargs):
        return self.loop.run_until_complete(self.client.embed(*args, **kwargs))

    def embed_parts(self, *args, **kwargs):
        return self.loop.run_until_complete(
            self.client.embed_parts(*args, **kwargs))

    def close(self):
        self.loop.run_until_complete(self.client.close())


@pytest.fixture(scope="module")
def aio_clients(server):
    if not _native_available():
        pytest.skip("no _temb_transport extension built")
    loop = asyncio.new_event_loop()
    both = (_Blocking(loop, server.target, transport="grpcio"),
            _Blocking(loop, server.target, transport="native"))
    assert [c.transport for c in both] == ["grpcio", "native"]
    yield both
    for client in both:
        client.close()
    loop.close()


@pytest.mark.parametrize("name", sorted(CALLS))
def test_asyncio_transports_give_the_sync_clients_bytes(clients, aio_clients,
                                                        name):
    call = CALLS[name]
    want = call(clients[0])
    for client in aio_clients:
        _same(want, call(client))
        _same(want, call(client))  # prepared


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_asyncio_transports_raise_the_sync_clients_errors(clients,
                                                          aio_clients, name):
    call, error = ERRORS[name]
    with pytest.raises(error) as e:
        call(clients[0])
    want = (type(e.value), e.value.code, e.value.details)
    for client in aio_clients:
        for _ in range(2):
            with pytest.raises(error) as e:
                call(client)
            assert (type(e.value), e.value.code, e.value.details) == want


def test_asyncio_native_calls_run_concurrently_and_cancel(server):
    """Many calls in flight on one native client each get their own answer;
    a cancelled call is cancelled (the server's gate is not needed: the
    cancel comes before the answer is read) and the client goes on; an
    expired deadline raises DeadlineExceededError."""
    if not _native_available():
        pytest.skip("no _temb_transport extension built")

    async def run():
        async with temb.aio.Client(server.target, transport="native") as c:
            sync = temb.Client(server.target, transport="grpcio")
            ts = [[float(i), float(i) * 3.5] for i in range(64)]
            results = await asyncio.gather(
                *(c.embed(t, preset="sdxl") for t in ts))
            for t, got in zip(ts, results):
                _same(sync.embed(t, preset="sdxl"), got)
            big = np.arange(4096, dtype=np.float32)
            task = asyncio.ensure_future(c.embed(big, dim=4096, **LDM))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert c._waiting == {}  # the call was cancelled, not abandoned
            with pytest.raises(temb.DeadlineExceededError):
                await c.embed(big, dim=4096, timeout=1e-6, **LDM)
            _same(sync.embed([7.0], preset="sdxl"),
                  await c.embed([7.0], preset="sdxl"))
            sync.close()
        # Closing a client cancels what it has in flight.
        c = temb.aio.Client(server.target, transport="native")
        tasks = [asyncio.ensure_future(c.embed(big, dim=4096, **LDM))
                 for _ in range(4)]
        await asyncio.sleep(0)
        await c.close()
        for task in tasks:
            try:
                await asyncio.wait_for(task, 30)
            except temb.TembError as error:
                # Cancelled in flight; an answer that came first is fine.
                assert error.code == grpc.StatusCode.CANCELLED, error
        # A call on the closed client fails at once rather than waiting.
        with pytest.raises(Exception) as closed:
            await asyncio.wait_for(c.embed([1.0], preset="sdxl"), 30)
        assert not isinstance(closed.value, asyncio.TimeoutError)

    asyncio.run(run())


@needs_native
def test_native_without_the_extension_says_how_to_build_it(monkeypatch,
                                                           tmp_path, server):
    monkeypatch.setattr(_transport, "_module", None)
    monkeypatch.setenv("TEMB_LOCAL_EXTENSION_DIR", str(tmp_path))
    monkeypatch.delenv("TEMB_TRANSPORT", raising=False)
    with pytest.raises(ImportError, match="temb_transport_ext"):
        temb.Client(server.target, transport="native")
    monkeypatch.setattr(_transport, "_warned_missing", False)
    # "auto" falls back, says why, and warns once per process.
    with pytest.warns(RuntimeWarning, match="temb_transport_ext"):
        with temb.Client(server.target) as c:
            assert c.transport == "grpcio"
            assert "temb_transport_ext" in c.transport_reason
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with temb.Client(server.target) as c:
            assert c.transport == "grpcio"


def test_transport_reason_says_why_grpcio_was_chosen(monkeypatch, server):
    monkeypatch.delenv("TEMB_TRANSPORT", raising=False)
    with temb.Client(server.target, transport="grpcio") as c:
        assert c.transport_reason == 'transport="grpcio"'
    monkeypatch.setenv("TEMB_TRANSPORT", "grpcio")
    with temb.Client(server.target) as c:
        assert c.transport_reason == "$TEMB_TRANSPORT=grpcio"
    monkeypatch.delenv("TEMB_TRANSPORT")
    with temb.Client(server.target,
                     tls=grpc.local_channel_credentials()) as c:
        assert c.transport == "grpcio"
        assert "grpc.ChannelCredentials" in c.transport_reason
    with temb.Client(server.target) as c:
        if c.transport == "native":
            assert c.transport_reason is None


# A forked child of a process that used the native transport (a data-loader
# worker, a multiprocessing pool with the fork start method).  Run in a
# process of its own so that pytest's process is not the one forked.
_FORK_SCRIPT = r"""
import os, sys, time
import numpy as np
import temb

target = sys.argv[1]
client = temb.Client(target, timeout=30, transport="native")
want = client.embed([1.0, 500.0], preset="sdxl")
# The parent uses the client's grpcio channel too (the other methods).
version = client.server_info().version
assert client.health() == temb.HealthStatus.SERVING
module = None
try:
    import torch
    import temb.torch
    module = temb.torch.Timesteps(64, True, 0.0, client=client)
    module_want = module(torch.tensor([3.0, 700.0]))
except ImportError:
    pass

pid = os.fork()
if pid == 0:
    # The child: the inherited client answers through grpcio, the same
    # bytes; a new client is grpcio too; "native" says why not.
    assert client.transport == "grpcio", client.transport
    for _ in range(3):
        got = client.embed([1.0, 500.0], preset="sdxl")
        assert got.tobytes() == want.tobytes()
    if module is not None:
        assert torch.equal(module(torch.tensor([3.0, 700.0])), module_want)
    assert client.server_info().version == version
    assert client.health() == temb.HealthStatus.SERVING
    with temb.Client(target, timeout=30) as fresh:
        assert fresh.transport == "grpcio"
        assert fresh.embed([1.0, 500.0], preset="sdxl").tobytes() == want.tobytes()
    try:
        temb.Client(target, transport="native")
    except ValueError as error:
        assert "fork" in str(error), error
    else:
        raise AssertionError("native was allowed in the forked child")
    del client, module  # destroyed in the child: must not close the parent's
    import gc
    gc.collect()
    sys.exit(0)  # a normal exit: finalizers run
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
# The parent's native connection still works.
assert client.transport == "native"
for _ in range(5):
    assert client.embed([1.0, 500.0], preset="sdxl", timeout=10).tobytes() == want.tobytes()
assert client.server_info().version == version
if module is not None:
    assert torch.equal(module(torch.tensor([3.0, 700.0])), module_want)
print("ok")
"""


@needs_native
def test_fork_moves_the_child_to_grpcio_and_keeps_the_parent(server,
                                                            client_dir):
    env = dict(os.environ, PYTHONPATH=str(client_dir))
    result = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT, server.target], env=env,
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", \
        result.stdout + result.stderr


# A process that exits while daemon threads are inside native calls: the
# native transport's embed() and temb.local's.  Run in a process of its own.
_EXIT_SCRIPT = r"""
import sys, threading, time
import temb

target, which = sys.argv[1], sys.argv[2]
if which == "native":
    client = temb.Client(target, timeout=30, transport="native")
    assert client.transport == "native"
    def call():
        client.embed([float(t) for t in range(64)], preset="sdxl")
else:
    from temb import local
    engine = local.engine()
    def call():
        engine.embed([float(t) for t in range(4096)], preset="sdxl")
started = threading.Semaphore(0)
def loop():
    started.release()
    while True:
        call()
for _ in range(4):
    threading.Thread(target=loop, daemon=True).start()
for _ in range(4):
    started.acquire()
time.sleep(0.2)
print("exiting", flush=True)
"""


@needs_native
@pytest.mark.parametrize("which", ["native", "local"])
def test_exit_with_native_calls_in_flight_in_daemon_threads(server,
                                                            client_dir,
                                                            which):
    """The interpreter exits cleanly (status 0) while daemon threads are
    inside the extensions' calls, as it does with grpcio: 10 runs."""
    env = dict(os.environ, PYTHONPATH=str(client_dir))
    for run in range(10):
        result = subprocess.run(
            [sys.executable, "-c", _EXIT_SCRIPT, server.target, which],
            env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and "exiting" in result.stdout, (
            run, result.returncode, result.stderr[-2000:])
