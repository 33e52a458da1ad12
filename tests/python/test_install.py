"""The package as a user gets it: built by pip in a fresh virtualenv, from
client/python and from an sdist of it, with its own extensions.

  - `pip install ./client/python`, then the sdist installed over it (built
    from a copy of the sdist unpacked outside the checkout, so it compiles
    from the sources the sdist carries): temb.local is available,
    temb.Client's transport is native, the package, both extensions and the
    server report one version, the stubs describe the server's proto, and
    temb.local's bytes equal the server's for fp32, fp16 and bf16 and
    several presets;
  - `pip wheel` of that sdist where pkg-config cannot see gRPC's C++
    development files (a PKG_CONFIG_LIBDIR holding every other .pc file of
    this machine): the wheel installs, temb.local works, and temb.Client
    uses grpcio and says why (transport_reason, one RuntimeWarning) -- what
    a machine without libgrpc++-dev gets, as far as the build can tell;
  - a build with no usable compiler fails with a message naming what to
    install.

Each build compiles with $CMAKE_BUILD_PARALLEL_LEVEL jobs (2 unless set).
"""

import json
import os
import pathlib
import subprocess
import sys
import tarfile
import textwrap
import time

import pytest

from temb_testing import REPO

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


@pytest.fixture(scope="module")
def sdist(client_dir, tmp_path_factory):
    """An sdist of client/python, made as the README says, unpacked and
    packed again from a directory outside the checkout: what a user who
    downloads it has."""
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--sdist", "--outdir", str(dist),
          str(client_dir)], env=_clean_env(), timeout=900)
    (made,) = dist.glob("temb-*.tar.gz")
    with tarfile.open(made) as archive:
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
    return made


def test_client_python_holds_no_copy_of_the_cpp_sources_or_the_proto(
        client_dir):
    """One source for the kernels, the core and the protocol: the package's
    build reads them from the checkout (or what the sdist gathered)."""
    tracked = _run(["git", "ls-files", "."], cwd=client_dir,
                   timeout=60).stdout.split()
    if not tracked:
        pytest.skip("client/python is not in a git checkout")
    copies = [f for f in tracked
              if f.endswith((".cc", ".h", ".cu", ".proto", "CMakeLists.txt"))]
    assert not copies, copies


@pytest.mark.slow
def test_pip_install_of_the_folder_and_of_its_sdist(
        server, info, client_dir, sdist, server_descriptor_set, tmp_path,
        record_property):
    env = _clean_env()
    python = _venv(tmp_path / "venv")
    check = [str(python), "-c", CHECK, server.target, info.version,
             str(server_descriptor_set), "native"]

    seconds = _pip(python, "install", "-q", str(client_dir), env=env)
    record_property("folder_install_seconds", round(seconds, 1))
    report = json.loads(_run(check, cwd=tmp_path, env=env,
                             timeout=300).stdout)
    assert report["transport_reason"] is None and not report["warnings"]
    assert not list(client_dir.glob("temb/_temb_*.so")), (
        "the build must not write into the source folder")

    seconds = _pip(python, "install", "-q", "--force-reinstall", "--no-deps",
                   str(sdist), env=env)
    record_property("sdist_install_seconds", round(seconds, 1))
    report = json.loads(_run(check, cwd=tmp_path, env=env,
                             timeout=300).stdout)
    assert report["transport"] == "native"
    print(json.dumps(report))


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
        server, info, sdist, server_descriptor_set, tmp_path):
    env = _clean_env(
        PKG_CONFIG_LIBDIR=str(_pkg_config_without_grpc(tmp_path / "pc")))
    python = _venv(tmp_path / "venv")
    wheels = tmp_path / "wheels"
    build = _run([str(python), "-m", "pip", "wheel", "-v", "--no-deps",
                  "-w", str(wheels), str(sdist)], env=env, timeout=1800)
    # The build says so, naming the Debian package that brings it back.
    log = build.stdout + build.stderr
    assert "no native transport" in log and "libgrpc++-dev" in log, log[-4000:]
    (wheel,) = wheels.glob("temb-*.whl")
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
