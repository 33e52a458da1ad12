"""The nginx front of deploy/front run on loopback for tests: its config
with only the listen ports, the upstream ports and the temporary paths
moved, so the file under test is the shipped one (or the one a rendered
ConfigMap holds)."""
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Dict

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
# temb-server's loopback ports in the shipped config, by role.
UPSTREAMS = {"grpc": 50052, "rest": 8002, "metrics": 9092}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def moved_config(text, workdir, upstreams):
    """(config text, {shipped listen port: test port}): every `listen` moved
    to a free loopback port, each upstream of `upstreams` ({role: port})
    pointed at that port, temporary files under `workdir`."""
    listens: Dict[int, int] = {}

    def listen(match):
        port = int(match.group(1))
        listens.setdefault(port, free_port())
        return f"listen 127.0.0.1:{listens[port]}"

    text = re.sub(r"listen (\d+)", listen, text)
    assert listens, "the front config listens on no port"
    for role, port in upstreams.items():
        shipped = f"127.0.0.1:{UPSTREAMS[role]}"
        assert shipped in text, f"the front config has no upstream {shipped}"
        text = text.replace(shipped, f"127.0.0.1:{port}")
    text = text.replace("/tmp/temb-front", str(Path(workdir) / "front"))
    if os.geteuid() == 0:
        # Workers of a root master run as "nobody", who cannot enter the
        # test's private directory; in a container nginx is not root.
        text = "user root;\n" + text
    return text, listens


class Front:
    """nginx running `text` (already moved) from `workdir`; stop() ends it."""

    def __init__(self, text, workdir, wait_port, timeout=20):
        assert Path(NGINX).exists(), (
            "nginx is not installed: scripts/install-deps.sh installs it "
            "(Debian package nginx-light)")
        workdir = Path(workdir)
        path = workdir / "nginx.conf"
        path.write_text(text)
        self.log_path = workdir / "nginx.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [NGINX, "-e", "stderr", "-c", str(path)], stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.pid = self.process.pid
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, self.log_path.read_text()
            try:
                socket.create_connection(("127.0.0.1", wait_port),
                                         timeout=1).close()
                return
            except OSError as e:
                if time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError("nginx did not listen") from e
                time.sleep(0.05)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def rss_bytes(self):
        children = subprocess.run(["pgrep", "-P", str(self.pid)],
                                  capture_output=True,
                                  text=True).stdout.split()
        return sum(_rss(pid) for pid in [self.pid, *map(int, children)])


def _rss(pid):
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    assert match, f"no VmRSS in /proc/{pid}/status"
    return int(match.group(1)) * 1024
