"""The package installs in a fresh, plain virtualenv from client/python copied
alone (no checkout around it) and from an sdist built from that copy: the
stubs are generated at build time from the package's own copy of the proto,
and only the runtime dependencies come along.  Also: that copy is the
repository's proto, byte for byte."""

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

CHECK = textwrap.dedent("""
    import sys, importlib.metadata as md
    import numpy as np
    import temb, temb.aio
    from temb._proto.temb.v1 import temb_pb2, temb_pb2_grpc
    target, version = sys.argv[1], sys.argv[2]
    assert temb.__version__ == version == md.version("temb"), temb.__version__
    assert temb.__file__.startswith(sys.prefix), temb.__file__  # not the copy
    requires = md.requires("temb")
    assert not any(r.startswith("grpcio-tools") for r in requires), requires
    with temb.Client(target, timeout=30) as c:
        emb = c.embed([0, 500, 999], preset="sdxl")
        assert emb.shape == (3, 320), emb.shape
        assert c.embed(np.zeros((2, 7)), preset="flux").shape == (2, 7, 256)
        parts = c.embed_parts({"timestep": [0.5], "guidance": [3.5]},
                              preset="flux", timestep_dtype="bf16")
        assert [p.shape for p in parts.values()] == [(1, 256), (1, 256)]
        assert c.server_info().version == version
    import os
    assert os.path.exists(os.path.join(os.path.dirname(temb.__file__), "py.typed"))
    print("ok", sorted(requires))
""")

# What a build or a test run leaves in client/python; a copy made by hand
# would not have it either.
_GENERATED = shutil.ignore_patterns("build", "dist", "*.egg-info", "_proto",
                                    "__pycache__", "*.pyc")


def _run(args, **kwargs):
    result = subprocess.run(args, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, (
        f"{args} failed:\n{result.stdout}\n{result.stderr}")
    return result


def test_vendored_proto_is_the_repository_proto(client_dir):
    repo = client_dir.parents[1]
    if not (repo / "proto" / "temb" / "v1" / "temb.proto").is_file():
        pytest.skip("client/python is not inside a temb checkout")
    vendored = client_dir / "proto" / "temb" / "v1" / "temb.proto"
    # setup.py (run by the conftest) refreshes the copy in a checkout.
    assert vendored.read_bytes() == (
        repo / "proto" / "temb" / "v1" / "temb.proto").read_bytes(), (
        "client/python/proto/temb/v1/temb.proto differs from "
        "proto/temb/v1/temb.proto: run `python setup.py build_proto` in "
        "client/python and commit the copy")
    assert (client_dir / "VERSION").read_text().strip() == __import__(
        "temb").__version__


@pytest.mark.slow
def test_pip_install_of_a_copied_folder_and_of_its_sdist(server, info,
                                                         client_dir, tmp_path):
    # The folder alone, where no ../../proto or ../../CMakeLists.txt exists.
    copy = tmp_path / "copied" / "temb-client"
    shutil.copytree(client_dir, copy, ignore=_GENERATED)
    assert not (copy.parents[1] / "proto").exists()
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=120)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    pip = [str(python), "-m", "pip", "install", "-q",
           "--disable-pip-version-check"]
    _run(pip + [str(copy)], env=env, timeout=900)
    check = _run([str(python), "-c", CHECK, server.target, info.version],
                 cwd=tmp_path, env=env, timeout=120)
    assert check.stdout.startswith("ok")

    # An sdist of the copy, installed over it.
    dist = tmp_path / "dist"
    _run([sys.executable, "setup.py", "-q", "sdist", "-d", str(dist)],
         cwd=copy, env=env, timeout=300)
    (sdist,) = dist.glob("temb-*.tar.gz")
    _run(pip + ["--force-reinstall", "--no-deps", str(sdist)], env=env,
         timeout=900)
    check = _run([str(python), "-c", CHECK, server.target, info.version],
                 cwd=tmp_path, env=env, timeout=120)
    assert check.stdout.startswith("ok")
    assert not any(pathlib.Path(copy).glob("temb/_proto")), (
        "building must not write stubs into the source folder")
