#!/usr/bin/env bash
# Prints, one a line, the Debian/Ubuntu packages that own the shared libraries
# the given binaries load.  The image's runtime stage installs exactly these,
# so it carries the .so files the build stage linked against and nothing else
# (no headers, compilers or -dev packages).  Deriving the list from the
# binaries, rather than writing it down, keeps it right when a dependency is
# added and across renames between releases (Ubuntu 24.04's t64 suffixes).
#
# Package names, not versions: the soname is part of a library package's
# name, so the name already pins the ABI; exact versions of packages that
# came with the base image may no longer be downloadable.
set -euo pipefail

if (($# == 0)); then
  echo "usage: $0 BINARY..." >&2
  exit 2
fi

ldd_out=$(ldd "$@")
if grep -q "not found" <<<"$ldd_out"; then
  echo "runtime-packages: unresolved libraries:" >&2
  grep "not found" <<<"$ldd_out" >&2
  exit 1
fi

for lib in $(awk '$2 == "=>" && $3 ~ /^\// {print $3}' <<<"$ldd_out" | sort -u); do
  real=$(realpath "$lib")
  # On merged-/usr systems dpkg may have recorded /lib/... or /usr/lib/...;
  # match the multiarch directory and file name, which are unambiguous.
  pattern="*/$(basename "$(dirname "$real")")/$(basename "$real")"
  owner=$(dpkg-query --search "$pattern" 2>/dev/null | head -n1 | cut -d: -f1) || true
  if [[ -z "$owner" ]]; then
    echo "runtime-packages: no package owns $lib ($real)" >&2
    exit 1
  fi
  echo "$owner"
done | sort -u
