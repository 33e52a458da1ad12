#!/usr/bin/env python3
"""What one REST connection costs the server before it is admitted: opens
N connections that each send an unfinished 16 KiB request header, and
reports the server's RSS growth per connection (plaintext, or with --tls a
throw-away certificate).  The figures behind the C x (H + 32 KiB) term of
docs/operations.md.

  bench/triton/rest_connection_memory.py --server build/bin/temb-server [--tls]
"""
import argparse
import re
import resource
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path


def rss_kib(pid):
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--tls", action="store_true")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    work = Path(tempfile.mkdtemp(prefix="temb-conn-mem-"))
    flags = [f"--address=127.0.0.1:0", f"--port_file={work}/port",
             "--metrics_address=", "--backend=cpu", "--log_level=warn",
             "--http_address=127.0.0.1:0", f"--http_port_file={work}/http",
             "--http_header_timeout=60s"]
    if args.tls:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048",
                        "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-keyout", work / "key.pem", "-out", work / "cert.pem"],
                       check=True, capture_output=True)
        flags += [f"--tls_cert={work}/cert.pem", f"--tls_key={work}/key.pem"]
    server = subprocess.Popen([args.server, *flags])
    try:
        while not (work / "http").exists() or not (work / "http").read_text():
            time.sleep(0.05)
        port = int((work / "http").read_text())
        time.sleep(1)
        base = rss_kib(server.pid)
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        head = (b"POST /v2/models/sd15/infer HTTP/1.1\r\nX-Pad: " +
                b"a" * 16000)
        held = []
        for _ in range(args.connections):
            sock = socket.create_connection(("127.0.0.1", port))
            if args.tls:
                sock = context.wrap_socket(sock)
            sock.sendall(head)
            held.append(sock)
        time.sleep(2)
        grown = rss_kib(server.pid) - base
        print(f"{'tls' if args.tls else 'plaintext'}: {args.connections} "
              f"connections, each with 16 KiB of unfinished header: "
              f"+{grown / 1024:.1f} MiB, {grown / args.connections:.1f} KiB "
              "each")
        for sock in held:
            sock.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
