#!/bin/sh
# The Python package's build, step by step, on the terminal of whoever runs
# pip (cmake/TembPythonPackage.cmake puts this in front of each compile and
# link): pip keeps a build's own output to itself unless run with -v.
#
#   temb_build_progress.sh STATE_DIR COMMAND [ARGUMENT...]
#
# Writes "temb: [n/N] compiling evaluator.cc" (or "linking ...") to
# /dev/tty, then runs COMMAND (ccache or the compiler, with its arguments).
# N is STATE_DIR/steps, written when the build was configured; n counts
# in STATE_DIR/done.  Without a terminal (CI, a pipe) it writes nothing.
state="$1"
shift
verb=linking
output=""
previous=""
for argument in "$@"; do
  case "$previous" in
    -o) output="$argument" ;;
  esac
  [ "$argument" = "-c" ] && verb=compiling
  previous="$argument"
done
name="$(basename "${output:-?}")"
name="${name%.o}"
# Parallel steps may count the same n now and then: it is a progress line.
done_so_far="$(cat "$state/done" 2>/dev/null || echo 0)"
step=$((done_so_far + 1))
echo "$step" >"$state/done" 2>/dev/null
steps="$(cat "$state/steps" 2>/dev/null || echo '?')"
{ printf 'temb: [%s/%s] %s %s\n' "$step" "$steps" "$verb" "$name" >/dev/tty; } 2>/dev/null
exec "$@"
