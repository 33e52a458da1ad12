#!/usr/bin/env bash
# One command: install what is missing, build, start temb-server (on the GPU
# when one works, else on the CPU), show a real request answered, then keep
# serving in the foreground until Ctrl-C / SIGTERM.
#   TEMB_ADDRESS   listen address (default 127.0.0.1:50051)
#   TEMB_METRICS   metrics address (default 127.0.0.1:9090)
#   TEMB_DEMO_ONLY=1  stop the server after the demo request (used by tests)
set -euo pipefail
cd "$(dirname "$0")/.."
TEMB_SKIP_PYTHON="${TEMB_SKIP_PYTHON:-1}" scripts/install-deps.sh
scripts/build.sh
BIN="${BUILD_DIR:-build}/bin"
ADDRESS="${TEMB_ADDRESS:-127.0.0.1:50051}"
METRICS="${TEMB_METRICS:-127.0.0.1:9090}"

"$BIN/temb-server" --address="$ADDRESS" --metrics_address="$METRICS" \
  --backend=auto "$@" &
SERVER_PID=$!
trap 'kill -TERM $SERVER_PID 2>/dev/null || true; wait $SERVER_PID' INT TERM

for _ in $(seq 1 100); do
  "$BIN/temb" health --target="$ADDRESS" >/dev/null 2>&1 && break
  kill -0 $SERVER_PID 2>/dev/null || { echo "temb-server exited" >&2; exit 1; }
  sleep 0.1
done
"$BIN/temb" info --target="$ADDRESS"
echo
echo "\$ temb embed --target=$ADDRESS --preset=sd15 --timesteps=0,500,999 --format=table"
"$BIN/temb" embed --target="$ADDRESS" --preset=sd15 --timesteps=0,500,999 --format=table
echo
echo "temb-server is serving on $ADDRESS (metrics: http://$METRICS/metrics); Ctrl-C stops it."
if [[ "${TEMB_DEMO_ONLY:-0}" == 1 ]]; then
  kill -TERM $SERVER_PID
fi
wait $SERVER_PID
