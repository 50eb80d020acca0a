#!/usr/bin/env bash
# Runs every test zblk has, on a fresh Debian machine, as root:
#   format and lints, the engine's unit, model and stress tests, the daemon's
#   and CLI's tests, a short coverage-guided fuzz run (fuzz/run.sh), then the
#   real device as swap in qemu (tests/vm/run.sh:
#   every scenario on Debian's 6.12 and 7.3 kernels, one boot each), and the
#   package and systemd units on a debootstrapped Debian 12 (tests/vm/systemd/run.sh,
#   two boots; ZBLK_SKIP_SYSTEMD=1 skips it).
# Usage: tests/run.sh [--no-vm]   (ZBLK_SKIP_VM=1 also skips the VM stages)
set -euo pipefail
cd "$(dirname "$0")/.."

skip_vm=${ZBLK_SKIP_VM:-0}
[ "${1:-}" = "--no-vm" ] && skip_vm=1

# Each stage's header says how far into the run it starts (CI has 90
# minutes; the whole run should stay under 45).
T0=$(date +%s)
stage() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }

bash tools/scripts/deps.sh build

stage "cargo fmt --check"
cargo fmt --all -- --check
stage "imports go downward (engine-dag.py and its own tests)"
python3 tools/scripts/test_engine_dag.py
python3 tools/scripts/engine-dag.py
stage "cargo clippy -D warnings (workspace lints: every unsafe documented)"
cargo clippy --workspace --all-targets -- -D warnings
stage "cargo test (workspace)"
cargo test --workspace

# Coverage-guided fuzzing, 10 s per target (fuzz/README.md): needs the
# nightly toolchain and cargo-fuzz (installed with cargo install when missing,
# about a minute once); without them, one line and go on.
if rustup toolchain list 2>/dev/null | grep -q '^nightly' &&
    ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    stage "installing cargo-fuzz"
    cargo install cargo-fuzz --locked >/dev/null 2>&1 || true
fi
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    stage "fuzz skipped: no nightly toolchain (rustup toolchain install nightly)"
elif ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    stage "fuzz skipped: cargo-fuzz not installed and could not be (cargo install cargo-fuzz)"
else
    stage "fuzz (every target 10 s)"
    bash fuzz/run.sh "${ZBLK_FUZZ_SECS:-10}"
fi

if [ "$skip_vm" = 1 ]; then
    stage "VM tests skipped (--no-vm / ZBLK_SKIP_VM=1)"
    exit 0
fi
stage "VM tests (qemu, real ublk device; kernels 6.12 and 7.3)"
bash tests/vm/run.sh
if [ "${ZBLK_SKIP_SYSTEMD:-0}" = 1 ]; then
    stage "systemd VM test skipped (ZBLK_SKIP_SYSTEMD=1)"
    exit 0
fi
stage "systemd VM test (the package and units on Debian 12 with systemd, kernel 6.12)"
# tests/vm/run.sh has just built the static binaries it packs.
ZBLK_VM_NOBUILD=1 bash tests/vm/systemd/run.sh
stage "all tests passed"
