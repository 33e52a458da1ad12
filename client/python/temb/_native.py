"""Finding the client's native extensions (built by CMake into
<build>/python/): ``_temb_local`` (temb.local's engine) and
``_temb_transport`` (temb.Client's calls through gRPC's C++ library).

Where an extension comes from: ``$TEMB_LOCAL_EXTENSION_DIR`` when set (the
directory holding the built ``*.so`` files), else a module of that name
inside this package (copy the built file next to this one to install it),
else, in a checkout of the temb repository, ``<checkout>/build/python``.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import pathlib
import sys
from typing import Any, Optional

EXTENSION_DIR_VARIABLE = "TEMB_LOCAL_EXTENSION_DIR"


def _load_from(name: str, path: pathlib.Path) -> Any:
    module_name = "temb." + name
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[module_name] = module
    return module


def _find_in(name: str, directory: pathlib.Path) -> Optional[pathlib.Path]:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = directory / (name + suffix)
        if path.is_file():
            return path
    return None


def checkout_build_dir() -> Optional[pathlib.Path]:
    """<checkout>/build/python when this file is client/python/temb/ of a
    checkout."""
    here = pathlib.Path(__file__).resolve()
    if len(here.parents) < 4 or here.parents[1].name != "python":
        return None
    return here.parents[3] / "build" / "python"


def recorded_missing(attribute: str) -> Optional[str]:
    """Why an installed package lacks an extension, as its build recorded
    it in ``temb._build`` (``NATIVE_TRANSPORT_MISSING``,
    ``NATIVE_LOCAL_MISSING``); None in a checkout, where the build
    recorded nothing, or where $TEMB_LOCAL_EXTENSION_DIR names the
    extensions."""
    if os.environ.get(EXTENSION_DIR_VARIABLE) is not None:
        return None
    try:
        import temb._build as build  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    value = getattr(build, attribute, None)
    return str(value) if value else None


def load(name: str, target: str) -> Any:
    """The extension `name` (e.g. "_temb_local"), built by the CMake target
    `target`; ImportError saying how to get it when it is nowhere."""
    directory = os.environ.get(EXTENSION_DIR_VARIABLE)
    if directory:
        path = _find_in(name, pathlib.Path(directory))
        if path is None:
            raise ImportError(
                f"no {name} extension for this Python in "
                f"${EXTENSION_DIR_VARIABLE}={directory} (build the CMake "
                f"target {target}, which writes <build>/python/)")
        return _load_from(name, path)
    module_name = "temb." + name
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise  # present, but something it needs is missing: say what
    build = checkout_build_dir()
    path = _find_in(name, build) if build is not None else None
    if path is not None:
        return _load_from(name, path)
    raise ImportError(
        f"the native extension {name} is not installed: build it "
        f"(scripts/build.sh, or cmake --build build --target {target}; it "
        "needs pybind11 and writes build/python/), then set "
        f"{EXTENSION_DIR_VARIABLE}=<build>/python or copy the {name}*.so "
        f"file into {pathlib.Path(__file__).parent}")
