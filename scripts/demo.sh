#!/usr/bin/env bash
# Installs what is missing, builds memprof and the demo workload, and
# profiles the workload. Run as root (or it re-runs itself with sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $EUID -eq 0 ]] || exec sudo -E "$0" "$@"
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/setup.sh
cargo build --release --quiet
mkdir -p target/demo
gcc -O2 -g -fno-omit-frame-pointer -o target/demo/workload demo/workload.c
echo "+ memprof trace --top 5 --depth 4 -- target/demo/workload $*" >&2
exec target/release/memprof trace --top 5 --depth 4 -- target/demo/workload "$@"
