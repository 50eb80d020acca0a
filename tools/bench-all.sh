#!/usr/bin/env bash
# tools/bench-all.sh: regenerates every figure of BENCHMARKS.md.
#
# Engine level (native): the commands of BENCHMARKS.md's engine sections, their
# output saved under bench-out/engine/. Device level (qemu guest, zblk against
# kernel zram in the same boot): tools/scripts/bench-device.sh, then the plot
# tools/scripts/plot.py. The engine tables in BENCHMARKS.md are written by
# hand from these outputs, the device tables are bench-out/device/tables.md;
# copy bench-out/device/results.json and the SVG to bench/results/ when
# they are quoted.
#
# Usage: tools/bench-all.sh [--engine-only | --device-only] [bench-device.sh options]
#   e.g. tools/bench-all.sh --device-only --rounds 3 --boots 2
# Environment: ZBLK_CORPUS (default ../shared/corpus/realmem-dev.bin.zst) and
# those of bench-device.sh / tests/vm/run.sh.
#
# Run it on a quiet machine: the figures are ratios measured in the same
# process or boot, but a second thread or the emulated guest needs cores
# of its own to say anything.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
ENGINE=1 DEVICE=1
case "${1:-}" in
--engine-only) DEVICE=0; shift;;
--device-only) ENGINE=0; shift;;
esac
CORPUS=${ZBLK_CORPUS:-$REPO/../shared/corpus/realmem-dev.bin.zst}
EOUT=$REPO/bench-out/engine
DOUT=$REPO/bench-out/device

log() { printf '[bench-all] %s\n' "$*" >&2; }

engine() {
    [ -f "$CORPUS" ] || { log "no corpus at $CORPUS"; exit 2; }
    mkdir -p "$EOUT"
    local bin=$EOUT/realmem-dev.bin c m
    zstd -qdcf "$CORPUS" >"$bin"
    cargo build --release -p zblk-bench --example engine_ratios --example discard_bench
    log "engine: store path against the bare codec, thread scaling"
    target/release/examples/engine_ratios "$CORPUS" --rounds 5 | tee "$EOUT/engine_ratios.txt"
    log "engine: deferred against immediate discard"
    : >"$EOUT/discard.txt"
    for c in 1 5 20; do
        target/release/examples/discard_bench "$bin" --threads 1,2,4 --rounds 5 --copies $c | tee -a "$EOUT/discard.txt"
    done
    target/release/examples/discard_bench "$bin" --threads 1,2,4 --rounds 5 --copies 5 --request-pages 1 |
        tee -a "$EOUT/discard.txt"
    log "engine: fragmentation and compaction"
    : >"$EOUT/fragmentation.txt"
    for c in 1 5; do for m in per-page packed; do
        target/release/examples/discard_bench "$bin" --churn --copies $c --mode $m --rounds 3 |
            tee -a "$EOUT/fragmentation.txt"
    done; done
    log "engine: IAA descriptor path against software deflate"
    cargo bench -p zblk-bench --bench accel_overhead -- 4096 7 | tee "$EOUT/accel_overhead.txt"
    rm -f "$bin"
}

device() {
    log "device: zblk against kernel zram in the qemu guest"
    bash tools/scripts/bench-device.sh --out "$DOUT" "$@"
    python3 tools/scripts/plot.py "$DOUT/results.json" "$DOUT/device.svg"
    log "device: $DOUT/results.json, $DOUT/device.svg"
}

[ "$ENGINE" = 1 ] && engine
[ "$DEVICE" = 1 ] && device "$@"
log "done"
