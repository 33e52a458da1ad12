"""Triton's perf_analyzer for the KServe tests over gRPC and REST: where the
binary is and the environment it needs.  A missing piece fails the test
with what to install; it is never a skip."""
import os
import pathlib
import shutil
import sys

import pytest


def perf_analyzer_env():
    """The wheel's binary links libcudart.so.12 even for CPU-only runs; the
    nvidia-cuda-runtime-cu12 wheel ships it (scripts/requirements-dev.txt)."""
    env = dict(os.environ)
    try:
        import nvidia.cuda_runtime  # pylint: disable=import-outside-toplevel
    except ImportError:
        pytest.fail("nvidia-cuda-runtime-cu12 is not installed "
                    "(scripts/requirements-dev.txt)")
    libs = [str(pathlib.Path(p) / "lib") for p in nvidia.cuda_runtime.__path__]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        libs + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
    return env


def find_perf_analyzer():
    """The perf_analyzer binary of the tritonclient wheel (pinned in
    scripts/requirements-dev.txt): beside this Python, else on PATH."""
    beside_python = pathlib.Path(sys.executable).parent / "perf_analyzer"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("perf_analyzer")
    if not found:
        pytest.fail("perf_analyzer not found (the tritonclient wheel of "
                    "scripts/requirements-dev.txt)")
    return found
