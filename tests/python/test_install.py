"""`pip install ./client/python` works in a fresh, plain virtualenv: the
stubs are generated at build time and only the runtime dependencies come
along."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

CHECK = textwrap.dedent("""
    import sys, importlib.metadata as md
    import temb, temb.aio
    from temb._proto.temb.v1 import temb_pb2, temb_pb2_grpc
    target, version = sys.argv[1], sys.argv[2]
    assert temb.__version__ == version == md.version("temb"), temb.__version__
    assert temb.__file__.startswith(sys.prefix), temb.__file__  # not the checkout
    requires = md.requires("temb")
    assert not any(r.startswith("grpcio-tools") for r in requires), requires
    with temb.Client(target, timeout=30) as c:
        emb = c.embed([0, 500, 999], preset="sdxl")
        assert emb.shape == (3, 320), emb.shape
        assert c.server_info().version == version
    import os
    assert os.path.exists(os.path.join(os.path.dirname(temb.__file__), "py.typed"))
    print("ok", sorted(requires))
""")


def test_pip_install_in_fresh_venv(server, info, client_dir, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         str(client_dir)], env=env, capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stdout + install.stderr
    check = subprocess.run(
        [str(python), "-c", CHECK, server.target, info.version],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.startswith("ok")
