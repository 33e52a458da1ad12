#!/usr/bin/env bash
# Checks the shipped .clang-format on C++ sources.  With no arguments: the
# files changed since TEMB_FORMAT_BASE (default: the first commit, i.e. every
# tracked C++ file; the tree is kept clean, so that is what changed files
# must match too).  With arguments: those files.  Prints each offending file
# with the diff clang-format wants; exit 1 if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT="${CLANG_FORMAT:-clang-format-14}"
if (($#)); then
  files=("$@")
else
  base="${TEMB_FORMAT_BASE:-$(git rev-list --max-parents=0 HEAD | tail -n 1)}"
  mapfile -t files < <(
    { git diff --name-only --diff-filter=d "$base" -- '*.cc' '*.h' '*.cu' '*.cuh'
      git ls-files --others --exclude-standard -- '*.cc' '*.h' '*.cu' '*.cuh'; } |
      sort -u)
fi
bad=0
for file in "${files[@]}"; do
  [[ -f "$file" ]] || continue
  if ! "$CLANG_FORMAT" --style=file "$file" | diff -u "$file" - >/tmp/check-format.$$ 2>&1; then
    echo "check-format: $file does not follow .clang-format:"
    head -n 40 /tmp/check-format.$$
    bad=1
  fi
done
rm -f /tmp/check-format.$$
echo "check-format: ${#files[@]} file(s) checked"
exit "$bad"
