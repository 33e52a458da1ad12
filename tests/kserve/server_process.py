"""A real temb-server process for the protocol tests."""

import os
import pathlib
import subprocess
import time

import pytest

START_TIMEOUT_S = 30


def require_env(name):
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set; run these tests through ctest")
    return value


class Server:
    """One temb-server process listening on 127.0.0.1 on a port it picked."""

    def __init__(self, workdir, extra_args=()):
        port_file = pathlib.Path(workdir) / "port"
        self.log_path = pathlib.Path(workdir) / "server.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [require_env("TEMB_SERVER"), "--address=127.0.0.1:0",
             f"--port_file={port_file}", "--metrics_address=",
             "--backend=cpu", *extra_args],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.process.poll() is not None:
                raise RuntimeError(f"temb-server exited: {self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"temb-server did not start: {self.log()}")
            time.sleep(0.05)
        self.address = f"127.0.0.1:{int(port_file.read_text().strip())}"

    def log(self):
        return self.log_path.read_text(errors="replace")

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self._log.close()
