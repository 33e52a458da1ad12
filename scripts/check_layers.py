#!/usr/bin/env python3
"""Checks the include graph of a build against the codemap's layers.

The graph comes from the build itself: `ninja -t deps` lists, for every
object file, each header the compiler actually read.  Each project file
belongs to one layer (LAYERS below, by directory: the README codemap), and a
layer may include only the layers it links (ALLOWED, closed transitively).
Fails on:
  - an include edge to a layer that is not below (an upward or sideways edge);
  - a cycle in the declared layers;
  - a project file in no layer (a new directory must be placed first).
Prints the layer graph the build shows (edges and how many includes each).

Usage: check_layers.py [--build DIR] [--graph]
"""
import argparse
import collections
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (layer, directory prefixes relative to the repository root), most specific
# first.  Generated protobuf code lives in the build tree under proto/.
LAYERS = [
    ("base", ["base/"]),
    ("kernels_cpu", ["kernels/cpu/"]),
    ("kernels_cuda", ["kernels/cuda/"]),
    ("kernels", ["kernels/registry/"]),
    ("kernels_api", ["kernels/include/", "kernels/src/"]),
    ("proto", ["proto/", "@build/proto/"]),
    ("models", ["server/models/"]),
    ("core", ["server/core/"]),
    ("v1_convert", ["server/v1_convert/", "@build/server/builtin_presets.cc"]),
    ("grpc_server", ["server/grpc/"]),
    ("native_frontend", ["server/native/"]),
    ("kserve_frontend", ["server/kserve/"]),
    ("rest_frontend", ["server/rest/"]),
    ("metrics", ["server/metrics/"]),
    ("app", ["server/app/", "server/main.cc"]),
    ("client", ["client/cpp/"]),
    ("cli", ["client/cli/"]),
    ("python_support", ["client/python_support/"]),
    ("local_ext", ["client/local/"]),
    ("transport_ext", ["client/transport/"]),
    ("testing", ["tests/testing/"]),
    ("tests", ["tests/"]),
    ("bench", ["bench/"]),
    ("fuzz", ["fuzz/", "@build/fuzz/"]),
]

# What each layer may include directly (it links these); the transitive
# closure is allowed too.
ALLOWED = {
    "base": [],
    "proto": [],
    "kernels_api": ["base"],
    "kernels_cpu": ["kernels_api"],
    "kernels_cuda": ["kernels_api"],
    "kernels": ["kernels_cpu", "kernels_cuda"],
    # The conditioning models: checkpoints, families, the row cache.
    "models": ["kernels"],
    "core": ["kernels", "models"],
    "v1_convert": ["core", "proto"],
    "grpc_server": ["core"],
    "native_frontend": ["grpc_server", "v1_convert"],
    "kserve_frontend": ["grpc_server", "proto"],
    "rest_frontend": ["kserve_frontend"],
    "metrics": ["core"],
    "app": ["native_frontend", "kserve_frontend", "rest_frontend", "metrics"],
    "client": ["proto", "base"],
    "cli": ["client", "v1_convert", "models"],
    # What both Python extensions share: the GIL released around a call.
    "python_support": [],
    # temb.local's extension: the service core in-process (a leaf).
    "local_ext": ["v1_convert", "python_support"],
    # temb.Client's native transport: gRPC and protobuf, and of temb.v1 the
    # generated header's field numbers (temb::proto_header; a leaf).
    "transport_ext": ["proto", "python_support"],
    # The tests' shared fakes and helpers; only tests include them.
    "testing": ["kernels"],
    # Leaves: nothing includes them.
    "tests": ["app", "cli", "client", "testing"],
    "bench": ["kernels", "proto"],
    "fuzz": ["rest_frontend", "v1_convert", "models"],
}


def closure(allowed):
    reach = {}

    def visit(layer, stack):
        if layer in stack:
            raise SystemExit("check_layers: the declared layers have a cycle: "
                             + " -> ".join(stack + [layer]))
        if layer in reach:
            return reach[layer]
        out = set()
        for below in allowed[layer]:
            out.add(below)
            out |= visit(below, stack + [layer])
        reach[layer] = out
        return out

    for layer in allowed:
        visit(layer, [])
    return reach


def layer_of(path, build):
    """The layer of an absolute path, or None outside the project."""
    path = os.path.realpath(path)
    candidates = []
    for layer, prefixes in LAYERS:
        for prefix in prefixes:
            if prefix.startswith("@build/"):
                full = os.path.join(build, prefix[len("@build/"):])
            else:
                full = os.path.join(ROOT, prefix)
            candidates.append((len(full), full, layer))
    for _, full, layer in sorted(candidates, reverse=True):
        if path == full or path.startswith(full.rstrip("/") + "/"):
            return layer
    if path.startswith(build + "/") or not path.startswith(ROOT + "/"):
        return None  # system headers, other generated files
    if "/.venv/" in path:
        return None
    return "?"


def deps(build):
    out = subprocess.run(["ninja", "-C", build, "-t", "deps"], check=True,
                         capture_output=True, text=True).stdout
    current = None
    for line in out.splitlines():
        if not line.strip():
            current = None
            continue
        if not line.startswith(" "):
            current = line.split(":")[0]
            continue
        if current is None:
            continue
        yield current, os.path.join(build, line.strip()) if not os.path.isabs(
            line.strip()) else line.strip()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--graph", action="store_true",
                        help="print the layer graph only")
    args = parser.parse_args()
    build = os.path.realpath(args.build)
    reach = closure(ALLOWED)

    # Object file -> its source: the first dependency ninja lists is the
    # source being compiled.
    sources = {}
    edges = collections.Counter()
    bad = []
    unplaced = set()
    for obj, dep in deps(build):
        if obj not in sources:
            sources[obj] = dep
            continue
        src = sources[obj]
        src_layer = layer_of(src, build)
        dep_layer = layer_of(dep, build)
        for path, layer in ((src, src_layer), (dep, dep_layer)):
            if layer == "?":
                unplaced.add(os.path.relpath(path, ROOT))
        if src_layer in (None, "?") or dep_layer in (None, "?"):
            continue
        if src_layer == dep_layer:
            continue
        edges[(src_layer, dep_layer)] += 1
        if dep_layer not in reach[src_layer]:
            bad.append((os.path.relpath(src, ROOT), os.path.relpath(dep, ROOT),
                        src_layer, dep_layer))
    if not sources:
        raise SystemExit(f"check_layers: no dependency data in {build} "
                         "(build it with Ninja first)")

    print("layer graph from the build (includer -> included: header reads):")
    for (a, b), n in sorted(edges.items()):
        print(f"  {a} -> {b}: {n}")
    if args.graph:
        return 0
    failed = False
    for path in sorted(unplaced):
        print(f"check_layers: {path} belongs to no layer (add it to LAYERS)")
        failed = True
    seen = set()
    for src, dep, a, b in sorted(bad):
        if (src, dep) in seen:
            continue
        seen.add((src, dep))
        print(f"check_layers: {src} ({a}) includes {dep} ({b}), "
              f"which {a} does not link")
        failed = True
    print(f"check_layers: {len(sources)} translation units, "
          f"{sum(edges.values())} cross-layer includes, "
          f"{'FAILED' if failed else 'OK'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
