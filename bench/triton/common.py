"""Shared pieces of the Triton-ecosystem benchmarks: perf_analyzer (the
binary inside the tritonclient wheel), temb-server processes and the
report's CSV.

Every run is bounded (timeouts on processes and waits) and a failing run
raises with the tool's output.
"""

import csv
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]

# Timesteps for perf_analyzer (its default FP32 input is the constant
# 1.85e31): a few real denoising steps.
TIMESTEPS = [999.0, 750.0, 500.0, 250.0, 1.0]


def perf_analyzer_path():
    beside = pathlib.Path(sys.executable).parent / "perf_analyzer"
    if beside.exists():
        return str(beside)
    found = shutil.which("perf_analyzer")
    if not found:
        raise SystemExit("perf_analyzer not found: pip install "
                         "'tritonclient[all]==2.41.0' (scripts/requirements-dev.txt)")
    return found


def perf_analyzer_env():
    """The wheel's perf_analyzer links libcudart.so.12 even for CPU-only
    runs: nvidia-cuda-runtime-cu12 ships it."""
    env = dict(os.environ)
    import nvidia.cuda_runtime  # pylint: disable=import-outside-toplevel
    libs = [str(pathlib.Path(p) / "lib") for p in nvidia.cuda_runtime.__path__]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        libs + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
    return env


def input_data_file(directory, input_name="TIMESTEP"):
    path = pathlib.Path(directory) / "timesteps.json"
    path.write_text(json.dumps(
        {"data": [{input_name: [t]} for t in TIMESTEPS]}))
    return str(path)


class TembServer:
    """temb-server on 127.0.0.1 with gRPC, REST (and nothing else) on ports
    it picks; `flags` are appended."""

    def __init__(self, binary, *flags, timeout=30):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="temb-bench-"))
        args = [str(binary), "--address=127.0.0.1:0",
                f"--port_file={self.dir / 'port'}",
                "--http_address=127.0.0.1:0",
                f"--http_port_file={self.dir / 'http_port'}",
                "--metrics_address=", "--log_level=warn", *flags]
        self.log = open(self.dir / "server.log", "wb")  # pylint: disable=consider-using-with
        self.process = subprocess.Popen(args, stdout=self.log,
                                        stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        self.grpc_port = self._port("port", deadline)
        self.http_port = self._port("http_port", deadline)

    def _port(self, name, deadline):
        path = self.dir / name
        while time.monotonic() < deadline:
            if path.exists() and path.read_text().strip().isdigit():
                return int(path.read_text())
            if self.process.poll() is not None:
                raise RuntimeError((self.dir / "server.log").read_text())
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"temb-server did not write {name}")

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.log.close()


def run_perf_analyzer(url, model, *, protocol="http", batch=1, concurrency=1,
                      input_data=None, interval_ms=1500, extra=(),
                      timeout=300):
    """One perf_analyzer run; returns its CSV row as a dict of floats (keys
    as perf_analyzer writes them) plus "report" (its stdout)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "out.csv"
        command = [perf_analyzer_path(), "-i", protocol, "-u", url, "-m",
                   model, "-b", str(batch), "--concurrency-range",
                   str(concurrency), "--measurement-interval",
                   str(interval_ms), "--stability-percentage", "100",
                   "-f", str(out), *extra]
        if input_data:
            command += ["--input-data", input_data]
        run = subprocess.run(command, env=perf_analyzer_env(),
                             capture_output=True, text=True, timeout=timeout,
                             check=False)
        if run.returncode != 0 or not out.exists():
            raise RuntimeError(f"{' '.join(command)}\n{run.stdout}{run.stderr}")
        with open(out, newline="", encoding="utf-8") as f:
            row = next(csv.DictReader(f))
    result = {k: float(v) for k, v in row.items() if _is_number(v)}
    result["report"] = run.stdout
    return result


def _is_number(text):
    try:
        float(text)
        return True
    except (TypeError, ValueError):
        return False


def median(values):
    return statistics.median(values) if values else float("nan")


def cpu_model():
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"
