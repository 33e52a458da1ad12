"""The benchmark baselines answer what the suite assumes they answer.

The echo server must send a tensor of exactly the size temb-server would,
and the Python server must compute the same embedding, or the ratios in
docs/benchmarks.md compare different work.  Binaries come from
$TEMB_BIN_DIR (set by ctest), else <repo>/build/bin.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
BIN_DIR = Path(os.environ.get("TEMB_BIN_DIR", REPO / "build" / "bin"))

# docs/semantics.md section 8 (float64 math).
LDM_D8_T1 = [0.540302306, 0.995004165, 0.99995, 0.9999995, 0.841470985,
             0.0998334166, 0.00999983333, 0.000999999833]
LDM_D8_T999 = [0.999649853, 0.807458658, -0.844469696, 0.541143507,
               -0.0264607527, -0.589924161, -0.535603335, 0.840930262]
DDPM_D7_T10_5 = [-0.87969576, 0.104807169, 0.00104999981, -0.475536928,
                 0.994492563, 0.999999449, 0]


def start(cmd, workdir, name):
    port_file = Path(workdir) / f"{name}.port"
    log = open(Path(workdir) / f"{name}.log", "wb")
    proc = subprocess.Popen([*map(str, cmd), f"--port_file={port_file}"],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text().strip()):
        assert proc.poll() is None, f"{name} exited early"
        assert time.monotonic() < deadline, f"{name} did not start"
        time.sleep(0.05)
    return proc, f"127.0.0.1:{port_file.read_text().strip()}"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("servers")
    procs = []
    try:
        echo, echo_target = start(
            [BIN_DIR / "temb-echo-server", "--address=127.0.0.1:0"], workdir,
            "echo")
        procs.append(echo)
        py, py_target = start(
            [sys.executable, REPO / "bench" / "python_server.py",
             "--address=127.0.0.1:0", "--workers=2"], workdir, "python")
        procs.append(py)
        yield {"echo": echo_target, "python": py_target}
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def embed(target, *flags):
    out = subprocess.run(
        [BIN_DIR / "temb", "embed", f"--target={target}", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60,
        check=True)
    return json.loads(out.stdout)


def test_echo_sends_zeros_of_the_requested_shape_and_dtype(servers):
    got = embed(servers["echo"], "--dim=9", "--flip_sin_to_cos",
                "--downscale_freq_shift=0", "--timesteps=1,2,3",
                "--dtype=fp16")
    assert got["shape"] == [3, 9]
    assert got["dtype"] == "fp16"
    assert got["data"] == [0.0] * 27


def test_echo_uses_the_preset_width_when_no_dim_is_given(servers):
    got = embed(servers["echo"], "--preset=sdxl", "--timesteps=5,6")
    assert got["shape"] == [2, 320]
    assert len(got["data"]) == 640


def test_python_server_matches_the_golden_rows(servers):
    got = embed(servers["python"], "--dim=8", "--flip_sin_to_cos",
                "--downscale_freq_shift=0", "--timesteps=1,999")
    assert got["shape"] == [2, 8]
    # float32 evaluation against float64 references (docs/semantics.md section 2).
    np.testing.assert_allclose(got["data"], LDM_D8_T1 + LDM_D8_T999,
                               rtol=0, atol=1e-6 + 5e-7 * 999)
    ddpm = embed(servers["python"], "--dim=7", "--noflip_sin_to_cos",
                 "--downscale_freq_shift=1", "--timesteps=10.5")
    np.testing.assert_allclose(ddpm["data"], DDPM_D7_T10_5, rtol=0,
                               atol=1e-5)


def test_temb_bench_drives_both_baselines(servers):
    for target in servers.values():
        out = subprocess.run(
            [BIN_DIR / "temb", "bench", f"--target={target}",
             "--preset=sdxl", "--batch=4", "--concurrency=2",
             "--requests=40", "--warmup=0s", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120,
            check=True)
        report = json.loads(out.stdout)
        assert report["ok"] == 40
        assert report["errors"] == {}
