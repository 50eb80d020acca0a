#!/usr/bin/env bash
# tools/scripts/bench-native-zram.sh: kernel zram's whole block path against
# zblk's engine, natively, on the same real-memory pages (the example
# bench/examples/native_zram.rs: 32-page O_DIRECT requests to /dev/zram0 from
# a populated mapping, the engine configured as the daemon runs it and as
# `zblk bench --private` runs it, interleaved rounds, per-page µs, CPU per
# page of every engine thread, and the ratios). Needs root and a kernel with
# zram (built in, or the module, which it loads); elsewhere it says so and
# exits 0. It resets the zram device it uses: not one in use.
#
# Usage: tools/scripts/bench-native-zram.sh [native_zram options]
#   e.g. tools/scripts/bench-native-zram.sh --rounds 7 --variants
# Environment: ZBLK_CORPUS (default ../shared/corpus/realmem-dev.bin.zst),
# ZBLK_ZRAM (default zram0).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
CORPUS=${ZBLK_CORPUS:-$REPO/../shared/corpus/realmem-dev.bin.zst}
DEV=${ZBLK_ZRAM:-zram0}

skip() { echo "bench-native-zram: skipped: $*" >&2; exit 0; }

[ "$(id -u)" = 0 ] || skip "needs root (it resets and sizes /dev/$DEV)"
if [ ! -e "/sys/block/$DEV" ]; then
    modprobe zram num_devices=1 2>/dev/null || true
    [ -e "/sys/block/$DEV" ] || skip "this kernel has no zram (/sys/block/$DEV missing, modprobe zram failed)"
fi
grep -q "^/dev/$DEV " /proc/swaps && skip "/dev/$DEV is a swap area in use"
grep -q "^/dev/$DEV " /proc/mounts && skip "/dev/$DEV is mounted"
[ -f "$CORPUS" ] || { echo "bench-native-zram: no corpus at $CORPUS (set ZBLK_CORPUS)" >&2; exit 2; }

cargo build --release -q -p zblk-bench --example native_zram
echo "# $(uname -r), $(nproc) CPUs, commit $(git rev-parse --short HEAD)," \
    "zram algorithms: $(cat "/sys/block/$DEV/comp_algorithm")"
exec "${CARGO_TARGET_DIR:-target}/release/examples/native_zram" "$CORPUS" --zram "$DEV" "$@"
