"""The REST port and system shared memory against hostile clients: one test
for each of the fourteen defects an outside review found (symptoms 1-14:
docs/kserve.md, "Hostile clients"), over real sockets against a real
temb-server.  A crash shows as a server no longer alive and answering; a
memory defect as peak RSS (VmHWM) past the bound docs/operations.md gives;
an availability defect as a well-behaved client left waiting."""
import concurrent.futures
import json
import os
import re
import socket
import ssl
import struct
import threading
import time
import uuid
import weakref
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from test_curl import curl, error_of, infer_body

MiB = 1 << 20
KiB = 1 << 10
FP32_ONE = np.array([[500.0]], dtype=np.float32)


# ---- helpers ---------------------------------------------------------------

# Under AddressSanitizer (scripts/sanitize.sh sets ASAN_OPTIONS) freed memory
# waits in ASan's quarantine and every allocation has red zones, so memory
# says nothing about the bounds: the plain build's run of these tests
# measures them, the sanitizer's checks everything else.
MEASURES_MEMORY = "ASAN_OPTIONS" not in os.environ


def assert_grew_less(grew, bound):
    if MEASURES_MEMORY:
        assert grew < bound, (grew / MiB, bound / MiB)


def peak_rss(srv):
    """The server's peak resident memory so far (VmHWM)."""
    status = Path(f"/proc/{srv.process.pid}/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M).group(1)) * KiB


def mappings(srv):
    return len(Path(f"/proc/{srv.process.pid}/maps").read_text().splitlines())


def assert_serving(srv, headers=()):
    """The server is alive and computes a real answer."""
    assert srv.alive(), srv.log()
    status, _, body = curl(srv.url + "/v2/models/sd15/infer", method="POST",
                           data=infer_body([999.0, 0.0]), headers=headers)
    assert status == 200, body
    assert len(json.loads(body)["outputs"][0]["data"]) == 2 * 320


def connect(srv, timeout=10):
    sock = socket.create_connection(("127.0.0.1", srv.http_port),
                                    timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


# Bytes read past the response they came with: the next pipelined answer.
_unread = weakref.WeakKeyDictionary()


def read_response(sock, timeout=10):
    """(status, headers, body) of the next HTTP response on `sock`; status 0
    when the connection closed first."""
    sock.settimeout(timeout)
    data = _unread.pop(sock, b"")
    while b"\r\n\r\n" not in data:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            chunk = b""
        if not chunk:
            return 0, {}, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    length = int(fields.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    _unread[sock] = rest[length:]
    return int(lines[0].split()[1]), fields, rest[:length]


def send_until_refused(sock, chunk, total):
    """Sends `chunk` until `total` bytes went or the server stopped taking
    them; returns the bytes sent."""
    sent = 0
    sock.settimeout(5)
    try:
        while sent < total:
            sock.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError, socket.timeout):
        pass
    return sent


def request_head(path, method="POST", fields=()):
    lines = [f"{method} {path} HTTP/1.1", "Host: temb", *fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.fixture
def arena_env(monkeypatch):
    # The memory bound's allocator term is A x 64 MiB for A arenas; two
    # keep it small next to what the defects grew.
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")


def memory_bound(quota, queued, arenas, connections, header_bytes):
    """docs/operations.md, above the idle server (plaintext REST):
    3Q + 2B + A x 64 MiB + C x (H + 32 KiB) + 64 threads x 64 KiB."""
    return (3 * quota + 2 * queued + arenas * 64 * MiB +
            connections * (header_bytes + 32 * KiB) + 64 * 64 * KiB)


# ---- the process dies (1-4) -------------------------------------------------

def test_1_binary_sizes_that_wrap_past_2_64_are_refused(server):
    header = json.dumps({"inputs": [
        {"name": "TIMESTEP", "shape": [1, 1], "datatype": "FP32",
         "parameters": {"binary_data_size": 2**64 - 1}},
        {"name": "GUIDANCE", "shape": [1], "datatype": "FP32",
         "parameters": {"binary_data_size": 5}}]}).encode()
    status, _, body = curl(
        server.url + "/v2/models/flux/infer", method="POST",
        data=header + b"\0" * 4,
        headers=[f"Inference-Header-Content-Length: {len(header)}"])
    assert status == 400, body
    assert "binary_data_size" in error_of(body)
    assert_serving(server)


@pytest.mark.parametrize("field", ["data", "shape"])
def test_2_json_nested_100000_levels_is_refused(server, field):
    deep = "[" * 100_000 + "1" + "]" * 100_000
    tensor = {"name": "TIMESTEP", "shape": [1, 1], "datatype": "FP32",
              "data": [1.0]}
    text = json.dumps({"inputs": [tensor]}).replace(
        json.dumps(tensor[field]), deep, 1)
    status, _, body = curl(server.url + "/v2/models/sd15/infer",
                           method="POST", data=text.encode())
    assert status == 400, body
    assert "nests deeper than 32 levels" in error_of(body)
    assert_serving(server)


def test_3_region_truncated_by_its_owner_is_an_error_not_a_fault(server):
    tag = uuid.uuid4().hex[:8]
    key = f"/temb-trunc-{tag}"
    region = shm.create_shared_memory_region(f"t-{tag}", key, 64 * KiB)
    try:
        shm.set_shared_memory_region(region, [FP32_ONE])
        status, _, body = curl(
            server.url + f"/v2/systemsharedmemory/region/t-{tag}/register",
            method="POST",
            data=json.dumps({"key": key, "byte_size": 64 * KiB}).encode())
        assert status == 200, body
        os.truncate(f"/dev/shm{key}", 0)
        as_input = {"inputs": [{
            "name": "TIMESTEP", "shape": [1, 1], "datatype": "FP32",
            "parameters": {"shared_memory_region": f"t-{tag}",
                           "shared_memory_byte_size": 4}}]}
        as_output = {"inputs": json.loads(infer_body([1.0]))["inputs"],
                     "outputs": [{"name": "EMBEDDING", "parameters": {
                         "shared_memory_region": f"t-{tag}",
                         "shared_memory_byte_size": 1280}}]}
        for request in (as_input, as_output):
            status, _, body = curl(server.url + "/v2/models/sd15/infer",
                                   method="POST",
                                   data=json.dumps(request).encode())
            assert status == 400, body
            assert f"t-{tag}" in error_of(body)
            assert_serving(server)
    finally:
        curl(server.url + f"/v2/systemsharedmemory/region/t-{tag}/unregister",
             method="POST")
        shm.destroy_shared_memory_region(region)


def test_4_registrations_are_limited_and_map_nothing(start_server):
    srv = start_server("--shm_max_regions=64")
    tag = uuid.uuid4().hex[:8]
    key = f"/temb-many-{tag}"
    region = shm.create_shared_memory_region(f"m-{tag}", key, 4 * KiB)
    try:
        before = mappings(srv)
        codes = []
        for i in range(600):
            status, _, body = curl(
                srv.url + f"/v2/systemsharedmemory/region/r{i}/register",
                method="POST",
                data=json.dumps({"key": key, "byte_size": 4096}).encode())
            codes.append(status)
            if status != 200:
                assert "shm_max_regions" in error_of(body)
        # A limit of the server's configuration, not an overload: 400.
        assert codes[:64] == [200] * 64
        assert set(codes[64:]) == {400}
        # The old server mapped every region; 65k of them ended it.
        assert_grew_less(mappings(srv) - before, 16)
        status, _, body = curl(srv.url + "/v2/systemsharedmemory/status")
        assert status == 200 and len(json.loads(body)) == 64
        assert_serving(srv)
    finally:
        shm.destroy_shared_memory_region(region)


# ---- memory (5-9) -----------------------------------------------------------

def test_5_header_that_never_ends_is_cut_at_the_limit(start_server):
    srv = start_server()  # --http_max_header_bytes=16384, the default
    base = srv.rss_bytes()

    def flood():
        sock = connect(srv)
        sock.sendall(b"POST /v2/models/sd15/infer HTTP/1.1\r\n")
        sent = send_until_refused(sock, b"X-Flood: " + b"a" * 1014 + b"\r\n",
                                  32 * MiB)
        status, _, body = read_response(sock)
        sock.close()
        return sent, status, body

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: flood(), range(8)))
    for sent, status, body in results:
        # Refused at 16 KiB; what else was sent sat in socket buffers.
        assert sent < 32 * MiB
        assert status in (0, 431), body
        if status == 431:
            assert "larger than 16384 bytes" in error_of(body)
    # Many small fields: the count limit.
    sock = connect(srv)
    sock.sendall(request_head("/v2/health/live", "GET",
                              [f"X-{i}: v" for i in range(200)]))
    status, _, body = read_response(sock)
    assert status == 431 and "more than 100 header fields" in error_of(body)
    sock.close()
    assert_grew_less(srv.rss_bytes() - base, 16 * MiB)
    assert_serving(srv)


def test_6_bodies_are_limited_for_every_framing_and_unread_without_token(
        start_server, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("s3cret\n")
    srv = start_server(f"--auth_token_file={tokens}")
    base = srv.rss_bytes()
    chunk = b"%x\r\n" % MiB + b"\0" * MiB + b"\r\n"
    # No token: 401 on the header, nothing of the chunked body read.
    sock = connect(srv)
    sock.sendall(request_head("/v2/models/sd15/infer",
                              fields=["Transfer-Encoding: chunked"]))
    status, fields, body = read_response(sock)
    assert status == 401, body
    assert fields.get("connection") == "close"
    sent = send_until_refused(sock, chunk, 1536 * MiB)
    sock.close()
    assert sent < 256 * MiB  # the old server took all 1.5 GiB
    # With the token, a chunked body is cut at the endpoint's limit.
    sock = connect(srv)
    sock.sendall(request_head("/v2/models/sd15/infer",
                              fields=["Transfer-Encoding: chunked",
                                      "Authorization: Bearer s3cret"]))
    sent = send_until_refused(sock, chunk, 1536 * MiB)
    status, _, body = read_response(sock)
    sock.close()
    assert status == 413, body
    assert "larger than this endpoint's limit" in error_of(body)
    assert sent < 256 * MiB
    # Framings other than Content-Length and chunked are refused, unread.
    sock = connect(srv)
    sock.sendall(request_head("/v2/models/sd15/infer",
                              fields=["Transfer-Encoding: identity",
                                      "Authorization: Bearer s3cret"]))
    status, _, body = read_response(sock)
    sock.close()
    assert status == 501 and "Transfer-Encoding" in error_of(body)
    # A body without Content-Length is no body (RFC 9112): its bytes are
    # read as the next request, which is malformed.
    sock = connect(srv)
    sock.sendall(request_head("/v2/models/sd15/infer", "PUT",
                              ["Authorization: Bearer s3cret"]))
    send_until_refused(sock, b"\0" * MiB, 4 * MiB)
    first, _, _ = read_response(sock)
    second, _, _ = read_response(sock)
    sock.close()
    assert first == 405 and second in (0, 400)
    assert_grew_less(srv.rss_bytes() - base, 32 * MiB)
    assert_serving(srv, headers=["Authorization: Bearer s3cret"])


def test_7_parsed_json_is_admitted_inside_the_memory_bound(start_server,
                                                           arena_env):
    quota, queued = 16 * MiB, 64 * MiB
    srv = start_server(f"--grpc_memory_quota={quota}",
                       f"--max_queued_bytes={queued}")
    base = srv.rss_bytes()
    rows = 540_000
    body = (b'{"inputs": [{"name": "TIMESTEP", "shape": [%d, 1], '
            b'"datatype": "FP32", "data": [' % rows +
            b",".join([b"[1]"] * rows) + b"]}]}")
    assert len(body) < 2162688  # under the REST body limit (max_batch 65536)

    def post():
        sock = connect(srv, timeout=60)
        sock.sendall(request_head("/v2/models/sd15/infer",
                                  fields=[f"Content-Length: {len(body)}"]) +
                     body)
        status, _, answer = read_response(sock, timeout=60)
        sock.close()
        return status, answer

    with concurrent.futures.ThreadPoolExecutor(48) as pool:
        results = list(pool.map(lambda _: post(), range(48)))
    codes = [status for status, _ in results]
    # Each is refused: over max_batch once parsed (400), or overload (429).
    assert set(codes) <= {400, 429}, codes
    assert 429 in codes
    for status, answer in results:
        assert ("must be <= 65536, got 540000" if status == 400 else
                "max_queued_bytes") in error_of(answer)
    bound = memory_bound(quota, queued, 2, 1024, 16 * KiB)  # C, H: defaults
    assert_grew_less(peak_rss(srv) - base, bound)
    assert_serving(srv)


def test_8_shared_memory_input_size_is_checked_before_any_copy(server):
    tag = uuid.uuid4().hex[:8]
    key = f"/temb-big-{tag}"
    size = 512 * MiB
    # Sparse: the object costs nothing until something is written.
    region = shm.create_shared_memory_region(f"b-{tag}", key, size)
    try:
        status, _, body = curl(
            server.url + f"/v2/systemsharedmemory/region/b-{tag}/register",
            method="POST",
            data=json.dumps({"key": key, "byte_size": size}).encode())
        assert status == 200, body
        base = peak_rss(server)
        request = json.dumps({"inputs": [{
            "name": "TIMESTEP", "shape": [1, 1], "datatype": "FP32",
            "parameters": {"shared_memory_region": f"b-{tag}",
                           "shared_memory_byte_size": size}}]}).encode()

        def post():
            return curl(server.url + "/v2/models/sd15/infer", method="POST",
                        data=request)

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: post(), range(4)))
        for status, _, body in results:
            assert status == 400, body
            assert "shared_memory_byte_size" in error_of(body)
        # A shape that does take the whole region is wider than any valid
        # input (max_batch 8-byte timesteps): refused before the read too.
        wide = json.loads(request)
        wide["inputs"][0].update(shape=[size // 8, 1], datatype="FP64")
        status, _, body = curl(server.url + "/v2/models/sd15/infer",
                               method="POST", data=json.dumps(wide).encode())
        assert status == 400, body
        assert "the largest input this server takes is 524288" in \
            error_of(body)
        # The old server: +1.5 GiB.
        assert_grew_less(peak_rss(server) - base, 64 * MiB)
    finally:
        curl(server.url + f"/v2/systemsharedmemory/region/b-{tag}/unregister",
             method="POST")
        shm.destroy_shared_memory_region(region)
    assert_serving(server)


def test_9_registry_names_and_count_are_limited(start_server):
    srv = start_server("--shm_max_regions=64")
    base = srv.rss_bytes()
    tag = uuid.uuid4().hex[:8]
    key = f"/temb-names-{tag}"
    region = shm.create_shared_memory_region(f"n-{tag}", key, 4 * KiB)
    try:
        # 600 KiB names travel in the URL: refused with the header.
        sock = connect(srv)
        name = "n" * (600 * KiB)
        sock.sendall(request_head(
            f"/v2/systemsharedmemory/region/{name}/register",
            fields=["Content-Length: 2"]) + b"{}")
        status, _, body = read_response(sock)
        sock.close()
        assert status == 431, body
        # A name or key longer than 256 bytes, as JSON or in a URL that fits.
        status, _, body = curl(
            srv.url + f"/v2/systemsharedmemory/region/{'n' * 300}/register",
            method="POST",
            data=json.dumps({"key": key, "byte_size": 4096}).encode())
        assert status == 400 and "256" in error_of(body), body
        status, _, body = curl(
            srv.url + "/v2/systemsharedmemory/region/short/register",
            method="POST",
            data=json.dumps({"key": "/" + "k" * 300,
                             "byte_size": 4096}).encode())
        assert status == 400 and "256" in error_of(body), body
        # 2,000 registrations of names at the limit: 64 at most.
        ok = 0
        for i in range(2000):
            status, _, _ = curl(
                srv.url + f"/v2/systemsharedmemory/region/"
                f"{str(i).rjust(256, 'r')}/register", method="POST",
                data=json.dumps({"key": key, "byte_size": 4096}).encode())
            ok += status == 200
        assert ok == 64
        status, _, body = curl(srv.url + "/v2/systemsharedmemory/status")
        assert status == 200 and len(json.loads(body)) == 64
        assert_grew_less(srv.rss_bytes() - base, 16 * MiB)
        assert_serving(srv)
    finally:
        shm.destroy_shared_memory_region(region)


# ---- availability and behaviour (10-14) -------------------------------------

def test_10_slow_clients_do_not_hold_the_port(start_server, certs):
    def slow_clients(srv, count, stop, tls_never_starts=False):
        socks = [connect(srv) for _ in range(count)]
        if tls_never_starts:
            return socks
        head = request_head("/v2/health/live", "GET")

        def trickle():
            for i in range(len(head)):
                if stop.is_set():
                    return
                for sock in socks:
                    try:
                        sock.send(head[i:i + 1])
                    except OSError:
                        pass
                stop.wait(2)

        threading.Thread(target=trickle, daemon=True).start()
        return socks

    srv = start_server()  # --http_header_timeout=10s, the default
    stop = threading.Event()
    socks = slow_clients(srv, 70, stop)
    try:
        time.sleep(1)
        for _ in range(20):
            started = time.monotonic()
            assert_serving(srv)
            assert time.monotonic() - started < 2
        # The slow ones are cut off at the header deadline.
        time.sleep(11)
        closed = 0
        for sock in socks:
            sock.settimeout(1)
            try:
                closed += sock.recv(1) == b""
            except ConnectionResetError:
                closed += 1
            except socket.timeout:
                pass
        assert closed == 70
    finally:
        stop.set()
        for sock in socks:
            sock.close()

    # HTTPS: connections that never start TLS hold nothing either.
    tls = start_server(f"--tls_cert={certs['server.pem']}",
                       f"--tls_key={certs['server.key']}")
    idle = slow_clients(tls, 66, stop, tls_never_starts=True)
    try:
        time.sleep(1)
        started = time.monotonic()
        status, _, body = curl(f"https://127.0.0.1:{tls.http_port}"
                               "/v2/health/ready",
                               tls=["--cacert", str(certs["ca.pem"])])
        assert status == 200, body
        assert time.monotonic() - started < 2
    finally:
        for sock in idle:
            sock.close()


def test_11_oversized_body_is_refused_unread(server):
    for expect in ([], ["Expect: 100-continue"]):
        sock = connect(server)
        started = time.monotonic()
        sock.sendall(request_head("/v2/models/sd15/infer",
                                  fields=["Content-Length: 100000000000",
                                          *expect]))
        status, fields, body = read_response(sock)
        sock.close()
        assert status == 413, body  # never "100 Continue"
        assert time.monotonic() - started < 2  # the old server: 30 s
        assert fields.get("connection") == "close"
        assert "larger than this endpoint's limit" in error_of(body)
    assert_serving(server)


def test_12_pipelined_requests_are_answered_in_order(server):
    sock = connect(server)
    body = infer_body([1.0])
    sock.sendall(request_head("/v2/health/live", "GET") +
                 request_head("/v2/models/sd15/infer",
                              fields=[f"Content-Length: {len(body)}"]) +
                 body + request_head("/v2", "GET"))
    live, _, _ = read_response(sock)
    infer, _, answer = read_response(sock)
    metadata, _, server_json = read_response(sock)
    assert (live, infer, metadata) == (200, 200, 200)
    assert json.loads(answer)["outputs"][0]["shape"] == [1, 320]
    assert json.loads(server_json)["name"] == "temb"
    # The connection stays open for more.
    sock.sendall(request_head("/v2/health/ready", "GET"))
    assert read_response(sock)[0] == 200
    sock.close()


def test_13_part_names_differing_only_in_case_are_given_twice(server):
    inputs = [{"name": name, "shape": [1], "datatype": "FP32", "data": [1.0]}
              for name in ("TIMESTEP", "GUIDANCE", "guidance")]
    status, _, body = curl(server.url + "/v2/models/flux/infer",
                           method="POST",
                           data=json.dumps({"inputs": inputs}).encode())
    assert status == 400, body
    assert "given twice" in error_of(body)
    client = grpcclient.InferenceServerClient(server.target)
    tensors = []
    for name in ("TIMESTEP", "GUIDANCE", "Guidance"):
        tensor = grpcclient.InferInput(name, [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], np.float32))
        tensors.append(tensor)
    with pytest.raises(InferenceServerException) as error:
        client.infer("flux", tensors)
    client.close()
    assert "given twice" in error.value.message()
    assert "INVALID_ARGUMENT" in str(error.value.status())


@pytest.mark.parametrize("size", ["16.9", "1e30", "-1"])
def test_14_register_byte_size_must_be_a_whole_byte_count(server, size):
    status, _, body = curl(
        server.url + "/v2/systemsharedmemory/region/r14/register",
        method="POST",
        data=('{"key": "/temb-none", "byte_size": %s}' % size).encode())
    assert status == 400, body
    assert ('"byte_size" must be an integer in [0, 9223372036854775807], '
            "got ") in error_of(body)
    assert_serving(server)


def test_connections_beyond_the_limit_are_closed_when_accepted(start_server):
    srv = start_server("--http_max_connections=8")
    held = [connect(srv) for _ in range(8)]
    try:
        time.sleep(0.5)
        extra = connect(srv)
        extra.settimeout(5)
        try:
            assert extra.recv(1) == b""  # closed before anything was read
        except ConnectionResetError:
            pass
        extra.close()
        # A connection given back makes room for the next one.
        held.pop().close()
        time.sleep(0.5)
        sock = connect(srv)
        sock.sendall(request_head("/v2/health/live", "GET"))
        assert read_response(sock)[0] == 200
        sock.close()
    finally:
        for sock in held:
            sock.close()
