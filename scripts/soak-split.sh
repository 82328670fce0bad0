#!/usr/bin/env bash
# The network-split suite (tests/cluster_split.rs) run N times in a row, outside the CI
# budget (each run takes one to four minutes): every run's figures (the split's timings,
# the acknowledged events' catch-up, the shared ledger at the end) and its verdict, then
# a tally. A failing run's whole output is kept in $OUT/run-K.log, its daemons' whole
# logs in $OUT/run-K/.
#
#   scripts/soak-split.sh [N]      (default 20; needs root for the network namespaces)
#
# Builds once (the daemon and the suite), as scripts/test.sh does.
set -uo pipefail
cd "$(dirname "$0")/.."
runs="${1:-20}"
OUT="${OUT:-target/soak-split}"
mkdir -p "$OUT"
export CARGO_INCREMENTAL=0
cargo build -q -p fuseboxd || exit 1
cargo test -q --test e2e_cluster_split --no-run || exit 1

passed=0
for k in $(seq 1 "$runs"); do
  started=$(date +%s)
  log="$OUT/run-$k.log"
  # A failing run keeps every daemon's whole log (with the shared ledger's claims and
  # write-backs at debug) beside its output.
  if FUSEBOX_TEST_KEEP_LOGS="$OUT/run-$k" \
    FUSEBOX_TEST_RUST_LOG="info,async_nats=warn,fuseboxd::cluster::shared_ledger=debug" \
    cargo test -q --test e2e_cluster_split -- --nocapture >"$log" 2>&1; then
    verdict=passed
    passed=$((passed + 1))
  else
    verdict="FAILED ($(grep -m1 -A1 'panicked at' "$log" | tail -1 | cut -c1-160))"
  fi
  echo "== run $k/$runs: $verdict in $(( $(date +%s) - started )) s"
  grep -E '^(split:|every acknowledged event|shared ledger:|op_keys executed|[0-9]+ runs in)' "$log" | sed 's/^/   /'
  [ "$verdict" = passed ] && rm -f "$log"
done
echo "== $passed of $runs runs passed (failed runs' output in $OUT/)"
[ "$passed" -eq "$runs" ]
