"""Real temb-server processes for the Python test suites.

A server listens on 127.0.0.1 with port 0 (or a given port) and reports the
picked ports through --port_file and --metrics_port_file, so tests never
guess a free port. Every wait is bounded.
"""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Set by ctest; a direct pytest run uses the default build tree.
BIN_DIR = Path(os.environ.get("TEMB_BIN_DIR", REPO / "build" / "bin"))

_SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """Yields (name, labels, value) for each sample of a Prometheus text
    page."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match:
            labels = dict(_LABEL.findall(match.group(2) or ""))
            yield match.group(1), labels, float(match.group(3))


class TembServer:
    """One temb-server process; its files (port, metrics_port, server.log)
    live in `workdir`.

    `flags` follow the address, port and metrics flags, so they can override
    them. With metrics=False the metrics endpoint is off. Raises RuntimeError
    (with the server's log) when the server exits or does not report its
    ports within `start_timeout` seconds.
    """

    def __init__(self, binary, workdir, *flags, port=0, metrics=False,
                 start_timeout=30.0):
        workdir = Path(workdir)
        port_file = workdir / "port"
        metrics_port_file = workdir / "metrics_port"
        self.log_path = workdir / "server.log"
        args = [str(binary), f"--address=127.0.0.1:{port}",
                f"--port_file={port_file}"]
        if metrics:
            args += ["--metrics_address=127.0.0.1:0",
                     f"--metrics_port_file={metrics_port_file}"]
        else:
            args.append("--metrics_address=")
        # The child keeps its own descriptor of the log.
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [*args, *flags], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + start_timeout
        try:
            self.port = self._read_port(port_file, deadline)
            self.metrics_port = (self._read_port(metrics_port_file, deadline)
                                 if metrics else None)
        except RuntimeError:
            self.kill()
            raise
        self.target = f"127.0.0.1:{self.port}"

    def _read_port(self, path, deadline):
        while time.monotonic() < deadline:
            text = path.read_text().strip() if path.exists() else ""
            if text.isdigit():
                return int(text)
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"temb-server exited with {self.process.returncode} "
                    f"before writing {path.name}:\n{self.log()}")
            time.sleep(0.05)
        raise RuntimeError(
            f"temb-server did not write {path.name} in time:\n{self.log()}")

    def log(self):
        return self.log_path.read_text(errors="replace")

    def alive(self):
        return self.process.poll() is None

    def terminate(self, timeout=30):
        """SIGTERM, then waits; returns the exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def stop(self, timeout=20):
        """SIGTERM, and SIGKILL if it has not exited within `timeout`."""
        if self.alive():
            try:
                self.terminate(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self):
        if self.alive():
            self.process.kill()
            self.process.wait(timeout=10)

    def rss_bytes(self):
        """Resident memory now, from /proc/PID/status (VmRSS, in kB)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        assert match, f"no VmRSS in /proc/{self.process.pid}/status"
        return int(match.group(1)) * 1024

    def metrics_text(self):
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read().decode()

    def metrics(self):
        """{(name, frozenset(labels)): value} from /metrics."""
        return {(name, frozenset(labels.items())): value
                for name, labels, value in parse_metrics(self.metrics_text())}

    def metric(self, name, **labels):
        """The sum of the samples of `name` whose labels include `labels`."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.metrics().items()
                   if n == name and wanted <= ls)

    # Seeing one call in flight.  The server tells calls apart only once
    # they finish (temb_requests_total, temb_output_bytes_total, the latency
    # and batch histograms and the debug request log, the one with the
    # request_id, are all written at the end of a call), so while a call
    # runs the only evidence is the in-flight gauge, which counts every
    # call.  It speaks of one call only where that call is the only one the
    # server has: the gauge must read 0 before the call starts (any other
    # load paused, see `paused`, or finished) and then rise.  Waiting for
    # "the gauge >= 1" under other load returns as soon as the load is
    # counted, possibly before the call under test was even sent.  The gauge
    # counts a call from the moment its handler runs, before admission, but
    # the handler parses the request and admits it in well under the time a
    # scrape of /metrics takes.

    def wait_idle(self, timeout=30):
        """Waits until the server counts no call in flight."""
        deadline = time.monotonic() + timeout
        while self.metric("temb_inflight_requests") != 0:
            assert time.monotonic() < deadline, (
                "calls are still in flight: pause other load before "
                "starting the call to watch")
            time.sleep(0.02)

    def wait_for_call(self, ended, timeout=30, interval=0.02):
        """After the test started calls on an idle server (`wait_idle`):
        True once the in-flight gauge counts one of them, False when
        `ended()` says they all ended before it was seen."""
        deadline = time.monotonic() + timeout
        while not ended():
            if self.metric("temb_inflight_requests") >= 1:
                return True
            assert time.monotonic() < deadline, "no call in flight"
            time.sleep(interval)
        return False

    def call_in_flight(self, start, attempts=5, timeout=30, settle=0.1):
        """start() -> a grpc future of one call that computes for a while;
        returns such a future once the server is seen computing it.  Other
        calls must be paused or over (see `wait_idle`).  The gauge counts a
        call from its arrival, before it is parsed and admitted, and a
        drain refuses a call not yet admitted: so the call must still be
        counted `settle` seconds later, which parsing and admission take
        far less than.  A call that ended before the gauge was seen (a
        descheduled test process can miss a window of a few tenths of a
        second), or within the settle, is replaced by a new one."""
        for _ in range(attempts):
            self.wait_idle(timeout)
            call = start()
            if self.wait_for_call(call.done, timeout):
                time.sleep(settle)
                if not call.done() and \
                        self.metric("temb_inflight_requests") >= 1:
                    return call
            call.result()  # ended early: its error, if any, surfaces here
        raise AssertionError(f"none of {attempts} calls was seen in flight")


@contextlib.contextmanager
def paused(process):
    """Stops `process` (SIGSTOP) for the block and resumes it (SIGCONT)
    after: a load generator that must not send while the test isolates one
    call of its own.  The calls it had sent are answered meanwhile."""
    process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        process.send_signal(signal.SIGCONT)


def cli_arguments(args):
    """`temb` CLI arguments as strings.  `health` and `info` get a 30 s
    deadline unless one is given: their default of 2 s answers "is it up
    now" for operators, and a busy test machine (a parallel test, a
    sanitizer build) can need more just to connect."""
    args = [str(a) for a in args]
    if args and args[0] in ("health", "info") and not any(
            a.startswith("--timeout") for a in args):
        args.append("--timeout=30s")
    return args


def server_factory(tmp_path_factory, binary, *default_flags, **options):
    """The body of a `start_server` fixture: yields start(*flags) ->
    TembServer (each in a fresh directory, after `default_flags`) and kills
    every server it started when the fixture ends."""
    servers = []

    def start(*flags):
        server = TembServer(binary, tmp_path_factory.mktemp("server"),
                            *default_flags, *flags, **options)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill()


def generate_client_stubs(client_dir=REPO / "client" / "python"):
    """The Python client's stubs, `client_dir`/temb/_proto, generated in
    place from the server's proto by the package build's own script
    (cmake/TembPythonStubs.cmake), when missing or older than their
    sources; what lets tests import client/python without installing it."""
    stamp = Path(client_dir) / "temb" / "_proto" / "__init__.py"
    script = REPO / "cmake" / "TembPythonStubs.cmake"
    sources = [script, REPO / "CMakeLists.txt",
               REPO / "proto" / "temb" / "v1" / "temb.proto"]
    if not stamp.exists() or any(
            s.stat().st_mtime > stamp.stat().st_mtime for s in sources):
        subprocess.run(["cmake", f"-DPYTHON={sys.executable}",
                        f"-DPACKAGE_DIR={client_dir}", "-P", str(script)],
                       check=True, timeout=300)


def generate_stubs(out, *protos, proto_dir=REPO / "proto", prefix=None):
    """Generates the Python modules of `protos` (paths under `proto_dir`) into
    `out` and puts `out` first on sys.path.

    The generated directories become regular packages, so that an installed
    `temb` Python client cannot shadow the generated `temb.v1` modules. With
    `prefix` they go under that top-level package instead (needed for protos
    whose package would collide with a real module, like grpc.health.v1);
    the wire names do not change.
    """
    out = Path(out)
    include = f"-I{prefix}={proto_dir}" if prefix else f"-I{proto_dir}"
    files = [f"{proto_dir}/{proto}" if prefix else proto for proto in protos]
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", include,
         f"--python_out={out}", f"--grpc_python_out={out}", *files],
        check=True, timeout=120)
    for generated in list(out.rglob("*_pb2.py")):
        package = generated.parent
        while package != out:
            (package / "__init__.py").touch()
            package = package.parent
    sys.path.insert(0, str(out))
