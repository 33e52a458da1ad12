"""Real temb-server processes and temb CLI runs for the deployment tests.

Servers listen on 127.0.0.1 with port 0 and report the picked ports through
--port_file and --metrics_port_file, so tests never guess a free port.
Every wait is bounded.
"""

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

STARTUP_TIMEOUT_S = 30.0

_SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def bin_dir():
    path = Path(os.environ.get("TEMB_BIN_DIR", ""))
    if not path.is_dir():
        raise RuntimeError(f"TEMB_BIN_DIR is not a directory: {str(path)!r}")
    return path


def binary(name):
    path = bin_dir() / name
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} does not exist: build the {name} target first")
    return path


def _read_port(path, deadline, proc, log):
    while time.monotonic() < deadline:
        text = path.read_text().strip() if path.exists() else ""
        if text.isdigit():
            return int(text)
        if proc.poll() is not None:
            raise RuntimeError(
                f"temb-server exited with {proc.returncode} before writing "
                f"{path.name}:\n{log.read_text()}")
        time.sleep(0.05)
    raise RuntimeError(f"temb-server did not write {path.name} in time:\n"
                       f"{log.read_text()}")


class Server:
    """One temb-server process; restartable on the same gRPC port."""

    def __init__(self, workdir, name, drain_grace="3s", extra_args=()):
        self.workdir = Path(workdir)
        self.name = name
        self.drain_grace = drain_grace
        self.extra_args = list(extra_args)
        self.port = 0  # 0 until the first start picks one; kept across restarts
        self.metrics_port = 0
        self.proc = None
        self.starts = 0

    def start(self):
        """Starts the server (on the port of its previous life, if any) and
        waits until it is listening and SERVING."""
        assert self.proc is None or self.proc.poll() is not None
        self.starts += 1
        tag = f"{self.name}.{self.starts}"
        port_file = self.workdir / f"{tag}.port"
        metrics_port_file = self.workdir / f"{tag}.metrics_port"
        self.log_path = self.workdir / f"{tag}.log"
        args = [
            str(binary("temb-server")),
            f"--address=127.0.0.1:{self.port}",
            f"--port_file={port_file}",
            "--metrics_address=127.0.0.1:0",
            f"--metrics_port_file={metrics_port_file}",
            "--backend=cpu",
            f"--drain_grace={self.drain_grace}",
            "--log_level=info",
            *self.extra_args,
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        port = _read_port(port_file, deadline, self.proc, self.log_path)
        assert self.port in (0, port), f"{tag} came back on {port}, not {self.port}"
        self.port = port
        self.metrics_port = _read_port(metrics_port_file, deadline, self.proc,
                                       self.log_path)
        while not health(self.address):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{tag} never became SERVING:\n{self.log()}")
            time.sleep(0.1)

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        return self.proc.wait(timeout=timeout)

    def stop(self):
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def log(self):
        return self.log_path.read_text(errors="replace")

    def metrics(self):
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()

    def requests_ok(self):
        """Calls this process has answered with OK, over every method."""
        total = 0.0
        for name, labels, value in parse_metrics(self.metrics()):
            if name == "temb_requests_total" and labels.get("code") == "OK":
                total += value
        return int(total)


def parse_metrics(text):
    """Yields (name, labels, value) for each sample of a Prometheus text page."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match:
            labels = dict(_LABEL.findall(match.group(2) or ""))
            yield match.group(1), labels, float(match.group(3))


def health(target, service=None, timeout=10):
    args = [str(binary("temb")), "health", f"--target={target}", "--timeout=2s"]
    if service is not None:
        args.append(f"--service={service}")
    result = subprocess.run(args, capture_output=True, timeout=timeout)
    return result.returncode == 0


def start_bench(target, duration, concurrency=4):
    """Starts `temb bench` in the background; finish with bench_result()."""
    args = [
        str(binary("temb")), "bench", f"--target={target}",
        f"--concurrency={concurrency}", f"--duration={duration}",
        "--warmup=0s", "--json", "--allow_errors",
    ]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)


def bench_result(proc, timeout):
    """The bench's JSON report; raises with its output if it failed."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise RuntimeError(f"temb bench did not finish in {timeout}s:\n{out}\n{err}")
    if proc.returncode != 0:
        raise RuntimeError(f"temb bench exited {proc.returncode}:\n{out}\n{err}")
    return json.loads(out)
