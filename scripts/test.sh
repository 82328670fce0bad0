#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs the real servers the integration
# tests start on loopback (nats-server, moto_server, prometheus), checks formatting and
# lints, builds once, then runs every test of every crate.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

echo "[test] cargo fmt --check" >&2
cargo fmt --all -- --check

echo "[test] cargo clippy -D warnings" >&2
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "[test] cargo test" >&2
# One build of every test binary first, so the tests themselves run against a warm tree.
cargo test --workspace --no-run --quiet
cargo test --workspace
