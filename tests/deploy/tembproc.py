"""Real temb-server processes and temb CLI runs for the deployment tests.

Servers listen on 127.0.0.1 with port 0 and report the picked ports through
--port_file and --metrics_port_file, so tests never guess a free port.
Every wait is bounded.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from temb_testing import TembServer  # noqa: E402

STARTUP_TIMEOUT_S = 30.0


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
        assert not self.alive()
        self.starts += 1
        tag = f"{self.name}.{self.starts}"
        workdir = self.workdir / tag
        workdir.mkdir()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        self.proc = TembServer(
            binary("temb-server"), workdir, "--backend=cpu",
            f"--drain_grace={self.drain_grace}", "--log_level=info",
            *self.extra_args, port=self.port, metrics=True,
            start_timeout=STARTUP_TIMEOUT_S)
        assert self.port in (0, self.proc.port), \
            f"{tag} came back on {self.proc.port}, not {self.port}"
        self.port = self.proc.port
        self.metrics_port = self.proc.metrics_port
        while not health(self.address):
            if not self.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{tag} never became SERVING:\n{self.log()}")
            time.sleep(0.1)

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def alive(self):
        return self.proc is not None and self.proc.alive()

    def signal(self, sig):
        self.proc.process.send_signal(sig)

    def wait(self, timeout):
        return self.proc.process.wait(timeout=timeout)

    def stop(self):
        if self.alive():
            self.proc.kill()

    def log(self):
        return self.proc.log()

    def requests_ok(self):
        """Calls this process has answered with OK, over every method."""
        return int(self.proc.metric("temb_requests_total", code="OK"))


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
