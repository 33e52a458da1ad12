"""The package's version, for its build backend ([[tool.dynamic-metadata]]
in pyproject.toml): the server's, read from the `project(temb VERSION x.y.z)`
line of the CMake project the extensions are built from, so that the
package, its extensions and the server can never disagree.

That project is the checkout around client/python, or, in an sdist, the
part of it the sdist carries under native/ (pyproject.toml's
sdist.force-include).
"""

import pathlib
import re
from typing import Any, Dict, Mapping

_PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1]
# An sdist's copy first: that is what its wheel is built from.
_PROJECTS = (_PACKAGE_ROOT / "native", _PACKAGE_ROOT.parents[1])
_PROJECT_LINE = re.compile(
    r"^project\(\s*temb\s+VERSION\s+([0-9]+(?:\.[0-9]+)*)", re.MULTILINE)


def dynamic_metadata(settings: Mapping[str, Any],
                     project: Mapping[str, Any]) -> Dict[str, str]:
    del settings, project  # nothing to configure
    for root in _PROJECTS:
        cmake_lists = root / "CMakeLists.txt"
        if not cmake_lists.is_file():
            continue
        match = _PROJECT_LINE.search(cmake_lists.read_text(encoding="utf-8"))
        if match is None:
            raise RuntimeError(
                f"{cmake_lists} has no `project(temb VERSION x.y.z)` line")
        return {"version": match.group(1)}
    raise RuntimeError(
        "temb's CMake project was not found: the package builds from a "
        "checkout of the temb repository (pip install ./client/python) or "
        "from an sdist made there, which carries the C++ sources it needs")
