"""The package as a user gets it, installed by pip into fresh virtualenvs
from the wheels that scripts/build-wheel.sh makes (client/python's sdist,
a wheel built from it per Python, repaired into a manylinux wheel):

  - the wheel for this Python in a fresh virtualenv: temb.local is
    available, temb.Client's transport is native, the package, both
    extensions and the server report one version, the stubs describe the
    server's proto, temb.local's bytes equal the server's for fp32, fp16 and
    bf16 and several presets, Client.condition's bytes equal those of the
    package built from source, and the offload patch on a tiny FLUX.1-dev
    transformer gives the same output as the transformer itself;
  - the wheel for Python 3.13 in a clean Debian 13 root filesystem
    (mmdebstrap): no compiler, no gRPC, Abseil, protobuf or OpenSSL
    package; the same checks but the offload patch (torch is not
    installed there);
  - where no manylinux wheel fits (Python 3.13 offered only the cp311
    one), pip picks the pure-Python wheel: temb.Client uses grpcio and
    temb.local is unavailable, both saying why;
  - a wheel built from the sdist where pkg-config cannot see gRPC's C++
    development files (a PKG_CONFIG_LIBDIR holding every other .pc file of
    this machine): temb.local works, and temb.Client uses grpcio and says
    why (transport_reason, one RuntimeWarning);
  - a build with no usable compiler fails with a message naming what to
    install.

Each build compiles with $CMAKE_BUILD_PARALLEL_LEVEL jobs (2 unless set).
"""

import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
import zipfile

import numpy as np
import pytest

from temb_testing import REPO, TembServer

# Runs inside the fresh virtualenv: argv = server target, server version,
# the server proto's FileDescriptorSet, expected transport.  Prints JSON.
CHECK = textwrap.dedent("""
    import importlib.metadata as md, json, re, sys, warnings
    import numpy as np
    from google.protobuf import descriptor_pb2
    import temb, temb.aio, temb.local
    from temb import _temb_local
    from temb._proto.temb.v1 import temb_pb2, temb_pb2_grpc
    target, server_version, descriptor_set, transport = sys.argv[1:5]
    report = {}
    assert temb.__file__.startswith(sys.prefix), temb.__file__
    assert _temb_local.__file__.startswith(sys.prefix), _temb_local.__file__
    versions = {"package": md.version("temb"), "temb": temb.__version__,
                "_temb_local": _temb_local.version, "server": server_version}
    if transport == "native":
        from temb import _temb_transport
        assert _temb_transport.__file__.startswith(sys.prefix)
        versions["_temb_transport"] = _temb_transport.version
    assert len(set(versions.values())) == 1, versions
    report["versions"] = versions

    # The stubs are the server's proto, compiled at build time.
    server_proto = descriptor_pb2.FileDescriptorSet.FromString(
        open(descriptor_set, "rb").read()).file[0]
    built = descriptor_pb2.FileDescriptorProto.FromString(
        temb_pb2.DESCRIPTOR.serialized_pb)
    built.name = server_proto.name
    def without_json_names(messages):  # protoc adds them to descriptor sets
        for message in messages:
            for field in message.field:
                field.ClearField("json_name")
            without_json_names(message.nested_type)
    without_json_names(server_proto.message_type)
    without_json_names(built.message_type)
    assert built == server_proto, "temb._proto is not proto/temb/v1/temb.proto"

    # The runtime floors are those the generated stubs check at import.
    requires = md.requires("temb")
    grpc_floor = temb_pb2_grpc.GRPC_GENERATED_VERSION
    stamp = re.search(r"ValidateProtobufRuntimeVersion\\(\\s*\\S+,\\s*"
                      r"(\\d+),\\s*(\\d+),\\s*(\\d+)",
                      open(temb_pb2.__file__).read())
    protobuf_floor = ".".join(stamp.groups()) if stamp else None
    assert f"grpcio>={grpc_floor}" in requires, (grpc_floor, requires)
    if protobuf_floor:
        assert f"protobuf>={protobuf_floor}" in requires, (protobuf_floor,
                                                         requires)
    assert not any(r.startswith("grpcio-tools") for r in requires), requires

    assert temb.local.available()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        client = temb.Client(target, timeout=60)
        second = temb.Client(target, timeout=60)
    report["transport"] = client.transport
    report["transport_reason"] = client.transport_reason
    report["warnings"] = [str(w.message) for w in caught]
    assert client.transport == transport, (client.transport,
                                           client.transport_reason)
    grpcio = temb.Client(target, timeout=60, transport="grpcio")

    presets = {p.name for p in client.server_info().presets}
    checked = []
    t = np.array([0, 0.5, 1, 17.25, 250, 999.75], np.float32)
    for preset in ["sd15", "sdxl", "sd3", "flux", "pixart"]:
        if preset not in presets:
            continue
        for dtype in ["fp32", "fp16", "bf16"]:
            arguments = dict(preset=preset, dtype=dtype, bf16_format="bits")
            served = client.embed(t, **arguments)
            assert served.tobytes() == grpcio.embed(t, **arguments).tobytes()
            local = temb.local.embed(t, **arguments)
            assert local.dtype == served.dtype and local.shape == served.shape
            assert local.tobytes() == served.tobytes(), (preset, dtype)
            checked.append(f"{preset}/{dtype}")
    assert len(checked) >= 9, checked
    report["bytes_equal"] = checked
    print(json.dumps(report))
""")


def _run(args, **kwargs):
    result = subprocess.run(args, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, (
        f"{args[:2]}... failed:\n{result.stdout[-6000:]}\n"
        f"{result.stderr[-6000:]}")
    return result


def _clean_env(**extra):
    """The environment of a user's shell: no checkout's extension dir, no
    transport choice, no test interpreter's paths."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV",
            "TEMB_LOCAL_EXTENSION_DIR", "TEMB_TRANSPORT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "2")
    env.update(extra)
    return env


def _venv(path):
    _run([sys.executable, "-m", "venv", str(path)], timeout=300)
    return path / "bin" / "python"


def _pip(python, *args, env, timeout=1800):
    start = time.monotonic()
    _run([str(python), "-m", "pip", *args, "--disable-pip-version-check"],
         env=env, timeout=timeout)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def server_descriptor_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("descriptor") / "temb.pb"
    _run([sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO / 'proto'}",
          f"--descriptor_set_out={out}", "temb/v1/temb.proto"], timeout=120)
    return out


def _other_python():
    """A Python 3.13 (Debian 13's python3) to build the clean room's wheel
    with: python3.13 on PATH, or pyenv's."""
    candidates = [shutil.which("python3.13"), *sorted(pathlib.Path(
        os.environ.get("PYENV_ROOT", pathlib.Path.home() / ".pyenv")).glob(
            "versions/3.13*/bin/python3.13"))]
    for candidate in filter(None, candidates):
        # A pyenv shim is on PATH even where its version is not selected.
        if subprocess.run([str(candidate), "-c", ""], capture_output=True,
                          timeout=60).returncode == 0:
            return str(candidate)
    raise AssertionError("no Python 3.13 here (python3.13 on PATH or "
                         "pyenv's): the clean room's wheel needs its headers")


def _build_wheels(work, out, pythons, terminal=False, **env):
    """scripts/build-wheel.sh: {tag: wheel} and what it printed (with
    `terminal`, run under script(1), which gives it a terminal)."""
    command = ["bash", str(REPO / "scripts" / "build-wheel.sh"), *pythons]
    if terminal:
        command = ["script", "-qec", shlex.join(command), "/dev/null"]
    done = _run(command,
                env=_clean_env(TEMB_WHEEL_WORK=str(work),
                               TEMB_WHEEL_DIR=str(out),
                               JOBS=os.environ.get(
                                   "CMAKE_BUILD_PARALLEL_LEVEL", "2"), **env),
                timeout=2400)
    return ({wheel.name.split("-")[2]: wheel for wheel in out.glob("*.whl")},
            done.stdout)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """scripts/build-wheel.sh for this Python and a Python 3.13: {"cp311":
    path, "cp313": path, "py3": the pure-Python wheel, "sdist": path}."""
    root = tmp_path_factory.mktemp("wheels")
    start = time.monotonic()
    made, _ = _build_wheels(root / "work", root / "dist",
                            [sys.executable, _other_python()])
    print(f"scripts/build-wheel.sh: {time.monotonic() - start:.0f} s")
    (made["sdist"],) = (root / "dist").glob("temb-*.tar.gz")
    return made


@pytest.mark.slow
def test_the_sdist_carries_the_sources_and_no_build_output(wheels):
    with tarfile.open(wheels["sdist"]) as archive:
        names = archive.getnames()
    root = names[0].split("/")[0]
    members = {n[len(root) + 1:] for n in names if n.startswith(root + "/")}
    # The C++ sources come from the checkout when the sdist is made ...
    for needed in ["native/CMakeLists.txt", "native/proto/temb/v1/temb.proto",
                   "native/kernels/cpu/cpu_backend.cc",
                   "native/server/core/embed_service.cc",
                   "native/server/models/evaluator.cc",
                   "native/server/models/ops/linear.cc",
                   "native/server/models/families/registry.cc",
                   "native/client/local/temb_local.cc",
                   "native/client/transport/temb_transport.cc",
                   "native/cmake/TembPythonStubs.cmake", "pyproject.toml"]:
        assert needed in members, needed
    # ... and nothing a build or a test run leaves in client/python.
    assert not any(m.startswith(("temb/_proto", "build/")) or m.endswith(".so")
                   for m in members), sorted(members)


@pytest.mark.slow
def test_the_wheels_are_manylinux_and_vendor_what_they_link(wheels):
    for tag in ("cp311", "cp313"):
        wheel = wheels[tag]
        assert re.fullmatch(rf"temb-[0-9.]+-{tag}-{tag}-manylinux_2_\d+_"
                            r"x86_64\.whl", wheel.name), wheel.name
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
        vendored = [n for n in names if n.startswith("temb.libs/")]
        for library in ("libgrpc++", "libprotobuf", "libabsl_", "libssl",
                        "libcrypto", "libsleef"):
            assert any(n.startswith("temb.libs/" + library)
                       for n in vendored), (library, vendored)
        assert any("_temb_transport" in n for n in names), names
        # Compressed, the whole wheel stays small (docs/python-client.md).
        assert wheel.stat().st_size < 16 << 20, wheel.stat().st_size


# Runs in a virtualenv with the wheel: argv = target, model, npz of the
# source-built package's answers.  Client.condition answers those bytes.
CONDITION_CHECK = textwrap.dedent("""
    import sys
    import numpy as np
    import temb
    target, model, expected = sys.argv[1:4]
    want = np.load(expected)
    client = temb.Client(target, timeout=60)
    assert client.transport == "native", client.transport_reason
    got = client.condition(model, want["timesteps"], guidance=3.5,
                           pooled_projections=want["pooled"],
                           bf16_format="bits")
    for name, array in got.items():
        assert array.tobytes() == want[name].tobytes(), name
    print(sorted(got))
""")

# Runs in the wheel's virtualenv with torch and diffusers visible: the
# offload patch on the tiny FLUX.1-dev transformer gives its own output.
OFFLOAD_CHECK = textwrap.dedent("""
    import sys
    import torch, diffusers
    import temb, temb.torch
    target, model, folder = sys.argv[1:4]
    assert temb.__file__.startswith(sys.prefix), temb.__file__
    transformer = diffusers.FluxTransformer2DModel.from_pretrained(
        folder, torch_dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed(3)
    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(torch.bfloat16)
    inputs = dict(hidden_states=randn(2, 4, 4),
                  encoder_hidden_states=randn(2, 3, 24),
                  pooled_projections=randn(2, 48),
                  timestep=torch.tensor([0.75, 0.75], dtype=torch.bfloat16),
                  guidance=torch.full([2], 3.5), img_ids=torch.zeros(4, 3),
                  txt_ids=torch.zeros(3, 3), return_dict=False)
    with torch.no_grad():
        want = transformer(**inputs)[0]
        offload = temb.torch.offload_conditioning(
            transformer, client=temb.Client(target, timeout=60), model=model)
        got = transformer(**inputs)[0]
    assert offload.freed_bytes > 0 and offload.calls == 1, offload
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    print("offload", offload.freed_bytes)
""")

FLUX_WIDTH = 64  # two heads of 32


@pytest.fixture(scope="module")
def condition_server(server_binary, tmp_path_factory):
    """A server with a tiny FLUX.1-dev (bf16) that diffusers builds and
    saves, and the source-built package's answers for it."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    import temb
    root = tmp_path_factory.mktemp("repository")
    torch.manual_seed(1)
    diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=2,
        attention_head_dim=FLUX_WIDTH // 2, num_attention_heads=2,
        joint_attention_dim=24, pooled_projection_dim=48,
        guidance_embeds=True, axes_dims_rope=(8, 12, 12)).to(
            torch.bfloat16).save_pretrained(root / "flux-dev")
    server = TembServer(server_binary, tmp_path_factory.mktemp("server"),
                        "--backend=cpu", f"--model_repository={root}",
                        start_timeout=60)
    timesteps = np.array([1000, 500.25, 41.7, 0], np.float32)
    pooled = np.random.default_rng(5).standard_normal((4, 48)).astype(
        np.float32)
    with temb.Client(server.target, timeout=60) as client:
        deadline = time.monotonic() + 60
        while any(m.state == "loading" for m in client.models()):
            assert time.monotonic() < deadline, "the model is still loading"
            time.sleep(0.1)
        answers = client.condition("flux-dev", timesteps, guidance=3.5,
                                   pooled_projections=pooled,
                                   bf16_format="bits")
    expected = root / "expected.npz"
    np.savez(expected, timesteps=timesteps, pooled=pooled, **answers)
    yield server, root, expected
    server.stop(timeout=15)


@pytest.mark.slow
def test_the_wheel_in_a_fresh_virtualenv(
        server, info, wheels, condition_server, server_descriptor_set,
        tmp_path, record_property):
    env = _clean_env()
    python = _venv(tmp_path / "venv")
    seconds = _pip(python, "install", "-q", str(wheels["cp311"]), env=env)
    record_property("wheel_install_seconds", round(seconds, 1))
    report = json.loads(_run(
        [str(python), "-c", CHECK, server.target, info.version,
         str(server_descriptor_set), "native"],
        cwd=tmp_path, env=env, timeout=300).stdout)
    assert report["transport_reason"] is None and not report["warnings"]
    conditioning, folder, expected = condition_server
    _run([str(python), "-c", CONDITION_CHECK, conditioning.target,
          "flux-dev", str(expected)], cwd=tmp_path, env=env, timeout=300)

    # torch and diffusers as the worker's image has them: the test
    # interpreter's, after the virtualenv's own packages.
    site = _run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                env=env, timeout=60).stdout.strip()
    pathlib.Path(site, "worker_image.pth").write_text(
        "\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n")
    out = _run([str(python), "-c", OFFLOAD_CHECK, conditioning.target,
                "flux-dev", str(folder / "flux-dev")],
               cwd=tmp_path, env=env, timeout=600).stdout
    assert out.startswith("offload"), out


# Runs where pip chose the pure-Python wheel: argv = server target.
PURE_CHECK = textwrap.dedent("""
    import sys, warnings
    import numpy as np
    import temb, temb.local
    assert not temb.local.available()
    try:
        temb.local.embed([1.0], preset="sdxl")
        raise AssertionError("temb.local computed without its extension")
    except ImportError as e:
        assert "pure-Python wheel" in str(e), e
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        client = temb.Client(sys.argv[1], timeout=60)
    assert client.transport == "grpcio", client.transport
    assert "pure-Python wheel" in client.transport_reason
    assert len(caught) == 1 and "pure-Python wheel" in str(caught[0].message)
    t = np.array([0, 500.5, 999], np.float32)
    assert client.embed(t, preset="sdxl").shape == (3, 320)
    print(client.transport_reason)
""")

# Debian 13 with its own python3 (3.13) and nothing else of ours.  Debian's
# python3 needs OpenSSL's runtime (libssl3t64) for its ssl module: the test
# shows that the wheel's extensions load the copies the wheel carries.
CLEAN_ROOM_PACKAGES = "python3,python3-venv"
# What temb could lean on: a compiler, gRPC, Abseil, protobuf, OpenSSL's
# headers.
# What the manylinux policy lets a wheel take from the system (auditwheel's
# policy list, the ones these extensions link).
SYSTEM_RUNTIME = ("libc.so", "libm.so", "libstdc++.so", "libgcc_s.so",
                  "libpthread.so", "libdl.so", "librt.so", "libz.so",
                  "ld-linux")
LEANED_ON = ("ls /usr/bin/cc /usr/bin/c++ /usr/bin/gcc /usr/bin/g++ "
             "/usr/include/openssl /usr/lib/x86_64-linux-gnu/libgrpc* "
             "/usr/lib/x86_64-linux-gnu/libabsl* "
             "/usr/lib/x86_64-linux-gnu/libprotobuf* 2>/dev/null; true")
# Where each extension's libraries resolve: none outside the wheel but the
# C and C++ runtimes and zlib.
RESOLVED = ("for f in /root/venv/lib/python3*/site-packages/temb/_temb_*.so; "
            "do ldd $f; done")


def _clean_room(root):
    """A Debian 13 root filesystem from the mirror apt uses here."""
    mirror = "http://deb.debian.org/debian"
    for line in pathlib.Path("/etc/apt/sources.list.d").glob("*.sources"):
        found = re.search(r"^URIs:\s*(\S+/debian)\s*$", line.read_text(),
                          re.MULTILINE)
        if found:
            mirror = found.group(1)
            break
    _run(["mmdebstrap", "--variant=apt", "--quiet",
          f"--include={CLEAN_ROOM_PACKAGES}", "trixie", str(root), mirror],
         timeout=900)
    shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
    # The CA bundle pip trusts here (a machine behind an inspecting proxy
    # needs it), as the container build gets it (Dockerfile).
    bundle = pathlib.Path(os.environ.get(
        "PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
    if bundle.is_file():
        shutil.copy(bundle, root / "root" / "ca.crt")


def _in_clean_room(root, script, timeout):
    """`script` by /bin/sh inside `root`, with /proc mounted in a private
    mount namespace (gone when it ends), on this machine's network."""
    environment = ["HOME=/root", "PATH=/usr/bin:/bin",
                   "PIP_DISABLE_PIP_VERSION_CHECK=1"]
    if (root / "root" / "ca.crt").is_file():
        environment.append("PIP_CERT=/root/ca.crt")
    return _run(["unshare", "--mount", "--propagation", "private", "--",
                 "sh", "-c", 'mount -t proc proc "$0/proc" && '
                 'exec chroot "$0" env -i "$@"', str(root), *environment,
                 "/bin/sh", "-c", script], timeout=timeout)


@pytest.mark.slow
def test_the_wheel_in_a_clean_debian_13_root(
        server, info, wheels, condition_server, server_descriptor_set,
        tmp_path, record_property):
    root = tmp_path / "trixie"
    start = time.monotonic()
    _clean_room(root)
    record_property("clean_room_seconds", round(time.monotonic() - start, 1))
    # Nothing temb could lean on: no compiler, no gRPC, Abseil, protobuf or
    # OpenSSL library.
    leaning = _in_clean_room(root, LEANED_ON, 60).stdout.split()
    assert not leaning, leaning
    conditioning, _, expected = condition_server
    for source in (wheels["cp313"], server_descriptor_set, expected):
        shutil.copy(source, root / "root" / source.name)
    (root / "root" / "check.py").write_text(CHECK)
    (root / "root" / "condition_check.py").write_text(CONDITION_CHECK)
    started = time.monotonic()
    _in_clean_room(root, "python3 -m venv /root/venv && "
                   "/root/venv/bin/python -m pip install -q "
                   "--disable-pip-version-check /root/" + wheels["cp313"].name,
                   600)
    record_property("clean_room_install_seconds",
                    round(time.monotonic() - started, 1))
    resolved = _in_clean_room(root, RESOLVED, 60).stdout
    outside = [line.split()[0] for line in resolved.splitlines()
               if "=>" in line and "/temb.libs/" not in line
               and not line.split()[0].startswith(SYSTEM_RUNTIME)]
    assert not outside, resolved
    report = json.loads(_in_clean_room(
        root, f"cd /root && venv/bin/python check.py {server.target} "
        f"{info.version} /root/{server_descriptor_set.name} native",
        300).stdout)
    assert report["transport_reason"] is None and not report["warnings"]
    assert len(report["bytes_equal"]) >= 9, report
    _in_clean_room(root, f"cd /root && venv/bin/python condition_check.py "
                   f"{conditioning.target} flux-dev /root/{expected.name}", 300)

    # Where no manylinux wheel fits (here: only the cp311 one is offered to
    # Python 3.13), pip takes the pure-Python wheel, which says why it lacks
    # the native paths.
    offered = root / "root" / "offered"
    offered.mkdir()
    for wheel in (wheels["cp311"], wheels["py3"]):
        shutil.copy(wheel, offered / wheel.name)
    (root / "root" / "pure_check.py").write_text(PURE_CHECK)
    _in_clean_room(root, "python3 -m venv /root/pure && "
                   "/root/pure/bin/python -m pip install -q numpy grpcio "
                   "protobuf && /root/pure/bin/python -m pip install -q "
                   "--no-index --find-links /root/offered temb", 600)
    chosen = _in_clean_room(root, "ls /root/pure/lib/python3*/site-packages/"
                            "temb-*.dist-info/WHEEL && cat /root/pure/lib/"
                            "python3*/site-packages/temb-*.dist-info/WHEEL",
                            60).stdout
    assert "Tag: py3-none-any" in chosen, chosen
    _in_clean_room(root, f"cd /root && pure/bin/python pure_check.py "
                   f"{server.target}", 300)


def _pkg_config_without_grpc(directory):
    """A PKG_CONFIG_LIBDIR with every .pc file pkg-config finds here except
    gRPC's: a machine without libgrpc++-dev, to the package's build."""
    directory.mkdir()
    search = _run(["pkg-config", "--variable", "pc_path", "pkg-config"],
                  timeout=60).stdout.strip().split(":")
    hidden = []
    for folder in map(pathlib.Path, search):
        for pc in sorted(folder.glob("*.pc")) if folder.is_dir() else []:
            if pc.name.startswith(("grpc", "gpr")):
                hidden.append(pc.name)
            elif not (directory / pc.name).exists():
                (directory / pc.name).symlink_to(pc)
    assert "grpc++.pc" in hidden, "this machine has no grpc++.pc to hide"
    return directory


@pytest.mark.slow
def test_without_grpc_development_files_the_package_falls_back_to_grpcio(
        server, info, wheels, server_descriptor_set, tmp_path):
    # scripts/build-wheel.sh from the same sdist: the compiles of the
    # wheels above are ccache hits, the build's log is the script's.  On a
    # terminal, the build shows its steps, though pip runs it without -v.
    work = tmp_path / "work"
    made, shown = _build_wheels(work, tmp_path / "dist", [sys.executable],
                                terminal=True, PKG_CONFIG_LIBDIR=str(
                                    _pkg_config_without_grpc(
                                        tmp_path / "pc")))
    steps = re.findall(r"temb: \[(\d+)/(\d+)\] (compiling|linking) (\S+)",
                       shown)
    assert ("compiling", "evaluator.cc") in [s[2:] for s in steps], shown
    assert any(s[2] == "linking" and s[3].startswith("_temb_local")
               for s in steps), shown
    # The count names the build's steps: none beyond it.
    assert all(int(s[0]) <= int(s[1]) for s in steps), steps
    wheel = made[wheels["cp311"].name.split("-")[2]]
    python = _venv(tmp_path / "venv")
    log = next(work.glob("build-cp*.log")).read_text()
    # The build says so, naming the Debian package that brings it back.
    assert "no native transport" in log and "libgrpc++-dev" in log, log[-4000:]
    _pip(python, "install", "-q", str(wheel), env=_clean_env())

    report = json.loads(_run(
        [str(python), "-c", CHECK, server.target, info.version,
         str(server_descriptor_set), "grpcio"],
        cwd=tmp_path, env=_clean_env(), timeout=300).stdout)
    assert "libgrpc++-dev" in report["transport_reason"], report
    # One warning for the process, not one per client.
    assert len(report["warnings"]) == 1, report["warnings"]
    assert "libgrpc++-dev" in report["warnings"][0]
    # Insisting on the native transport names what is missing.
    insist = subprocess.run(
        [str(python), "-c",
         "import temb, sys; temb.Client(sys.argv[1], transport='native')",
         server.target], capture_output=True, text=True, env=_clean_env(),
        cwd=tmp_path, timeout=120)
    assert insist.returncode != 0 and "_temb_transport" in insist.stderr


@pytest.mark.slow
def test_a_build_without_a_compiler_names_what_to_install(client_dir,
                                                          tmp_path):
    missing = tmp_path / "no-such-compiler"
    env = _clean_env(CC=str(missing), CXX=str(missing))
    python = _venv(tmp_path / "venv")
    result = subprocess.run(
        [str(python), "-m", "pip", "wheel", "--no-deps", "-w",
         str(tmp_path / "wheels"), str(client_dir)],
        capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "apt install g++" in output, output[-4000:]
