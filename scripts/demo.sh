#!/usr/bin/env bash
# The fusebox demo: a real nats-server (JetStream) and fuseboxd on loopback, two Rust
# agents behind the gate — one stuck in a loop, one paginating legitimately — and the
# kill switch stopping the first while the second finishes.
#
#   bash scripts/demo.sh
#
# Everything runs on 127.0.0.1 with free ports and temporary directories, and is
# killed and removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

say "setup (nats-server, moto_server, prometheus)"
bash scripts/setup.sh

say "build (release)"
cargo build --release -q -p fuseboxd -p fusebox-client --bin fuseboxd --example demo_agent
BIN=target/release

WORK=$(mktemp -d -t fusebox-demo.XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

NATS_PORT=$(free_port)
METRICS_PORT=$(free_port)
NATS_URL="nats://127.0.0.1:$NATS_PORT"

say "nats-server -js on $NATS_URL"
nats-server -js -a 127.0.0.1 -p "$NATS_PORT" -sd "$WORK/nats" >"$WORK/nats.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$NATS_PORT") 2>/dev/null && break
  sleep 0.1
done

say "fuseboxd (log in $WORK/data, metrics on 127.0.0.1:$METRICS_PORT)"
"$BIN/fuseboxd" --config config/fusebox.toml --nats-url "$NATS_URL" \
  --data-dir "$WORK/data" --metrics-listen "127.0.0.1:$METRICS_PORT" 2>"$WORK/fuseboxd.log" &
PIDS+=($!)
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$METRICS_PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$METRICS_PORT/readyz" >/dev/null || { cat "$WORK/fuseboxd.log"; echo "fuseboxd not ready" >&2; exit 1; }
echo "ready"

say "two agents: one loops on the same search, one pages through a listing"
"$BIN/examples/demo_agent" --nats "$NATS_URL" --mode loop --run research-42 &
LOOP=$!
"$BIN/examples/demo_agent" --nats "$NATS_URL" --mode paginate --run triage-7 &
PAGE=$!
wait "$LOOP" "$PAGE"

say "what the guard counted (/metrics)"
curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" \
  | grep -E '^fusebox_(runs_stopped_total|decisions_total\{action="(block|stop|warn)")' || true

# --- cloud watchdog -------------------------------------------------------------------
# Placeholder for the cloud-watchdog part of the demo (owned by the watchdog work): start
# moto_server on a free loopback port, launch an EC2 instance for a run, stop the run,
# and show the leftover instance torn down. Add it here; $WORK, $NATS_URL, $PIDS and
# free_port are available, and cleanup() kills everything appended to PIDS.
# --------------------------------------------------------------------------------------

say "done: the looping run was stopped on its kill switch; the paging run completed"
