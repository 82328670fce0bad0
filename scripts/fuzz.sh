#!/usr/bin/env bash
# Runs the cargo-fuzz targets of fuzz/ and prints, per target, the executions, the
# coverage (libFuzzer's `cov`: edges reached; `ft`: features) and the findings.
#
#   bash scripts/fuzz.sh                 # every target
#   bash scripts/fuzz.sh event_parse     # some targets
#
# Each target runs FUZZ_RUNS executions (default 10 M) or FUZZ_SECONDS (default 1800),
# whichever comes first, FUZZ_PARALLEL targets at a time (default 1: this is meant for
# a shared machine; run it under `nice`). The committed seeds (fuzz/corpus/<target>) are
# read, never written: what the fuzzer finds goes to fuzz/work/<target> (gitignored),
# crashes, hangs (> 10 s) and allocations above 512 MiB to fuzz/artifacts/<target>.
# Needs the nightly toolchain and `cargo install cargo-fuzz`. Exits non-zero on any
# finding. Not part of scripts/test.sh: fuzzing is open-ended; each finding becomes a
# regression test in the crate that owns the code.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
runs=${FUZZ_RUNS:-10000000}
seconds=${FUZZ_SECONDS:-1800}
parallel=${FUZZ_PARALLEL:-1}

if [ $# -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cd fuzz && cargo +nightly fuzz list)
fi
(cd fuzz && cargo +nightly fuzz build)

run_target() {
    local target=$1
    local work=$root/fuzz/work/$target artifacts=$root/fuzz/artifacts/$target
    mkdir -p "$work" "$artifacts"
    (cd fuzz && cargo +nightly fuzz run "$target" "$work" "$root/fuzz/corpus/$target" -- \
        -runs="$runs" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -malloc_limit_mb=512 -print_final_stats=1 -artifact_prefix="$artifacts/" \
        >"$root/fuzz/work/$target.log" 2>&1) || true
}

pids=()
for target in "${targets[@]}"; do
    run_target "$target" &
    pids+=($!)
    if [ "${#pids[@]}" -ge "$parallel" ]; then
        wait "${pids[0]}"
        pids=("${pids[@]:1}")
    fi
done
wait

status=0
printf '%-18s %12s %8s %8s %9s  %s\n' target execs cov ft seconds findings
for target in "${targets[@]}"; do
    log=$root/fuzz/work/$target.log
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -n 1 | awk '{print $2}')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | awk '{print $2}')
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -n 1 | awk '{print $2}')
    took=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | tail -n 1 | awk '{print $2}')
    if [ -n "${execs:-}" ] && [ -n "${took:-}" ] && [ "$took" -gt 0 ]; then
        took=$((execs / took))
    fi
    findings=$(find "$root/fuzz/artifacts/$target" -type f 2>/dev/null | wc -l)
    [ "$findings" -gt 0 ] && status=1
    # A run that ended without its final stats crashed (or was cut short).
    [ -z "${execs:-}" ] && status=1
    printf '%-18s %12s %8s %8s %9s  %s\n' "$target" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${took:-?}" "$findings"
    find "$root/fuzz/artifacts/$target" -type f 2>/dev/null | sed 's/^/    /'
done
exit $status
