#!/usr/bin/env bash
# Builds what the benchmark suite needs and regenerates docs/benchmarks.md.
#   bench/run.sh [--quick] [--gpu] [--build-dir=DIR] [--no-build]
# Uses the project venv (.venv), creating it when missing.  On a GPU machine
# add --gpu (CUDA build and the CUDA kernel rows; PyTorch is used when the
# venv has it).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
timeout 900 .venv/bin/python -m pip install --quiet -r bench/requirements.txt
exec timeout 3600 .venv/bin/python bench/run.py "$@"
