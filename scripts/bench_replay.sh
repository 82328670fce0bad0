#!/usr/bin/env bash
# `fusebox replay` beside its floor, the seed's reference LoopGuard in JavaScript (gate +
# observe in-core, no parsing), measured in the same run, three rounds, medians last.
# The figure is the ratio: absolute rates swing up to 2x between runs on shared machines.
#
#   bash scripts/bench_replay.sh [FUSEBOX] [SEED_JS] [EVENTS]
#
# FUSEBOX defaults to target/release/fusebox, SEED_JS to ../shared/bench/
# seed_loopguard_bench.js (beside the repository), EVENTS to 340000.
set -euo pipefail
cd "$(dirname "$0")/.."
fusebox=${1:-target/release/fusebox}
seed=${2:-../shared/bench/seed_loopguard_bench.js}
events=${3:-340000}
trace=${TMPDIR:-/tmp}/fusebox-bench-replay-$events.jsonl

[ -x "$fusebox" ] || { echo "no $fusebox: cargo build --release -p fusebox-cli --bin fusebox" >&2; exit 1; }
[ -f "$seed" ] || { echo "no reference loop at $seed" >&2; exit 1; }
[ -s "$trace" ] || "$fusebox" generate --events "$events" --out "$trace"

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

rates=() loops=() ratios=()
for round in 1 2 3; do
    # "... = 258000 calls/s (...)" and "...; 1.234 s (250000 events/s)"
    loop=$(node "$seed" 500000 | sed -n 's/.* = \([0-9]*\) calls\/s.*/\1/p')
    rate=$("$fusebox" replay "$trace" 2>&1 >/dev/null | sed -n 's/.*(\([0-9]*\) events\/s)$/\1/p')
    ratio=$(awk -v r="$rate" -v l="$loop" 'BEGIN {printf "%.2f", r / l}')
    echo "round $round: replay $rate events/s, reference loop $loop calls/s, ratio $ratio"
    rates+=("$rate") loops+=("$loop") ratios+=("$ratio")
done
echo "median: replay $(printf '%s\n' "${rates[@]}" | median) events/s," \
    "reference loop $(printf '%s\n' "${loops[@]}" | median) calls/s," \
    "ratio $(printf '%s\n' "${ratios[@]}" | median) (goal >= 1.15)"
