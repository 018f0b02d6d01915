#!/usr/bin/env bash
# Runs every fuzz target (fuzz/libfuzzer, libFuzzer through cargo fuzz) for the given seconds
# each and prints the executions per target and in total. Crashes are saved by libFuzzer under
# fuzz/libfuzzer/artifacts/<target>/; copy each into fuzz/regressions/<target>/ once fixed so
# `cargo test -p torchcomms-fuzz` keeps running it.
#
#   scripts/fuzz.sh [seconds-per-target] [target...]
#
# Env: FUZZ_JOBS (parallel targets, default 1), FUZZ_WRITE_SEEDS=1 (refresh the corpus seeds from
# real messages first), FUZZ_SANITIZER (none | address; default none:
# the decoders are safe Rust, and uninstrumented runs are several times faster), FUZZ_ARGS
# (more libFuzzer flags). Only a stable toolchain is needed: RUSTC_BOOTSTRAP=1 lets cargo fuzz
# pass its -Z flags. Installs cargo-fuzz when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS="${1:-60}"
shift || true
SAN="${FUZZ_SANITIZER:-none}"
JOBS="${FUZZ_JOBS:-1}"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install --locked cargo-fuzz
fi

TARGETS=("$@")
if [ ${#TARGETS[@]} = 0 ]; then
    mapfile -t TARGETS < <(sed -n 's/^name = "\(.*\)"/\1/p' fuzz/libfuzzer/Cargo.toml | grep -v '^torchcomms-libfuzzer$')
fi

FUZZ_DIR=fuzz/libfuzzer
# Debug assertions and overflow checks on, as in tests: an overflow is a finding.
BUILD=(--fuzz-dir "$FUZZ_DIR" -s "$SAN" --debug-assertions)
echo "== building ${#TARGETS[@]} targets (sanitizer: $SAN)"
cargo fuzz build "${BUILD[@]}"

# Seeds from real messages into each corpus, when asked (the committed corpus keeps them; the
# test builds the workspace again, without RUSTC_BOOTSTRAP, as the test suite does).
if [ "${FUZZ_WRITE_SEEDS:-0}" = 1 ]; then
    env -u RUSTC_BOOTSTRAP cargo test -q -p torchcomms-fuzz --test regressions -- --ignored write_seeds >/dev/null
fi

LOGS=$(mktemp -d)
run_one() {
    local t=$1
    mkdir -p "fuzz/corpus/$t"
    # A finding makes cargo fuzz fail: record its status rather than let `set -e` end here.
    local rc=0
    cargo fuzz run "${BUILD[@]}" "$t" "fuzz/corpus/$t" -- \
        -max_total_time="$SECS" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        ${FUZZ_ARGS:-} >"$LOGS/$t.log" 2>&1 || rc=$?
    echo "$rc" >"$LOGS/$t.rc"
}
i=0
for t in "${TARGETS[@]}"; do
    run_one "$t" &
    i=$((i + 1))
    if [ $((i % JOBS)) = 0 ]; then wait; fi
done
wait

total=0
failed=0
printf '%-18s %14s %10s  %s\n' target executions exec/s result
for t in "${TARGETS[@]}"; do
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$LOGS/$t.log" | tail -n 1)
    n=${n:-0}
    rate=$(( n / (SECS > 0 ? SECS : 1) ))
    rc=$(cat "$LOGS/$t.rc")
    if [ "$rc" = 0 ]; then res=ok; else res="FAILED (rc $rc, log $LOGS/$t.log)"; failed=1; fi
    printf '%-18s %14d %10d  %s\n' "$t" "$n" "$rate" "$res"
    total=$((total + n))
done
printf '%-18s %14d\n' total "$total"
if [ "$failed" = 1 ]; then
    echo "crash inputs: $FUZZ_DIR/artifacts/<target>/" >&2
    exit 1
fi
