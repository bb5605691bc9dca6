#!/usr/bin/env bash
# Installs what building and testing memprof needs on a fresh Debian 12 machine
# (golang-go, and golang-1.23-go from bookworm-backports, for the Go tests and
# the one that loads memprof's pprof output in go tool pprof;
# gdb for the unwinder test that compares its frames with gdb's backtrace;
# debuginfod (the server) and binutils (strip, objcopy) for the symbols tests;
# bpftrace only for the comparison rows of `cargo xtask bench`;
# prometheus for the test that scrapes memprof monitor's /metrics;
# systemd for systemd-analyze, which checks packaging/memprof.service;
# systemtap-sdt-dev for sys/sdt.h, which the USDT fixture is built with;
# chromium, and playwright-core from npm, for the tests of the HTML page;
# cargo-deb for the .deb of `cargo xtask dist`).
# Idempotent: each step checks first and does nothing when already done.
# bpf-linker's LLVM major must equal that of the nightly rustc that emits
# the BPF bitcode (22 here); a newer nightly (1.101+) is on LLVM 23, which
# Debian 12 lacks: never `rustup update` it.
set -euo pipefail

cd "$(dirname "$0")/.."
LLVM_MAJOR=22
log() { echo "setup: $*" >&2; }

need_apt=()
for pkg in llvm-${LLVM_MAJOR}-dev libpolly-${LLVM_MAJOR}-dev libzstd-dev zlib1g-dev \
           bpftool libc6-dbg gcc g++ make gdb golang-go bpftrace debuginfod binutils \
           libjemalloc-dev libgoogle-perftools-dev libmimalloc-dev musl-tools prometheus systemd systemtap-sdt-dev python3.11 \
           chromium fonts-dejavu-core; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if ((${#need_apt[@]})); then
  log "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# Go 1.23 from bookworm-backports beside Debian's 1.19: the Go tests run
# both, as Go's tables changed layout in 1.20.
if ! dpkg-query -W -f='${Status}' golang-1.23-go 2>/dev/null | grep -q "install ok installed"; then
  backports=/etc/apt/sources.list.d/memprof-bookworm-backports.sources
  if [[ ! -f $backports ]]; then
    log "adding bookworm-backports ($backports)"
    cat > "$backports" <<'SOURCES'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  fi
  log "apt-get install -t bookworm-backports golang-1.23-go"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends -t bookworm-backports golang-1.23-go >/dev/null
fi

# The nightly that emits BPF bitcode must use the same LLVM major as bpf-linker.
nightly_llvm=$(rustc +nightly -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
if [[ "$nightly_llvm" != "$LLVM_MAJOR" ]]; then
  echo "setup: nightly rustc uses LLVM $nightly_llvm, bpf-linker needs LLVM $LLVM_MAJOR; do not 'rustup update'" >&2
  exit 1
fi

if ! rustup component list --toolchain nightly --installed | grep -q '^rust-src'; then
  log "rustup component add rust-src --toolchain nightly"
  rustup component add rust-src --toolchain nightly
fi

if ! command -v bpf-linker >/dev/null 2>&1; then
  log "cargo install bpf-linker (built for LLVM ${LLVM_MAJOR})"
  PATH=/usr/lib/llvm-${LLVM_MAJOR}/bin:$PATH cargo install bpf-linker --locked \
    --version 0.13.0 --no-default-features --features llvm-${LLVM_MAJOR}
fi
# cargo-deb, for `cargo xtask dist`'s .deb (and its test).
if ! command -v cargo-deb >/dev/null 2>&1; then
  log "cargo install cargo-deb"
  cargo install cargo-deb --locked --version 3.8.0
fi

# playwright-core (no browser download: the tests use Debian's chromium).
if [[ ! -d tests/browser/node_modules/playwright-core ]]; then
  command -v npm >/dev/null 2>&1 || {
    log "apt-get install npm"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
  }
  log "npm install playwright-core (tests/browser)"
  (cd tests/browser && npm install --no-audit --no-fund --loglevel=error)
fi
log "ready"
