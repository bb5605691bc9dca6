#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs the unit
# tests and the integration tests (real BPF in the real kernel: needs root),
# and checks formatting and lints. Extra arguments go to the test runner.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $EUID -eq 0 ]] || exec sudo -E "$0" "$@"
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/setup.sh
cargo fmt --all -- --check
cargo build --release
cargo clippy --release --workspace --all-targets -- -D warnings
(cd memprof-ebpf && cargo +nightly clippy --release --target bpfel-unknown-none -Z build-std=core -- -D warnings)
# Tests that load BPF share kernel state; they serialize themselves, two
# threads keep the build-and-compare work of one test busy meanwhile.
# --no-fail-fast: a failure in one test binary still lets the others run,
# so the closing count covers the whole suite.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --release --workspace --no-fail-fast -- --test-threads=2 "$@" 2>&1 | tee "$log" || status=$?
# One closing line for the whole suite (cargo prints one per test binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
exit "$status"
