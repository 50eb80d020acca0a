#!/usr/bin/env bash
# tools/scripts/bench-device.sh: zblk against kernel zram at the device level,
# inside the qemu guest of tests/vm/run.sh, both in the same boot.
#
# Boots the guest BOOTS times with the opt-in `bench` scenario
# (tests/vm/guest/scenarios/bench.sh: usemem swap pressure, munmap 64/256 MB
# by one process and 2 x 128 MB by two at once, the real-memory page corpus
# written to the raw device, random 4 KB O_DIRECT reads and writes with
# `randio` at queue depth 1 and 4, zblk's own latency percentiles), ROUNDS
# rounds per boot, then collects every `BENCH {json}` line of the console
# logs into one results file with tools/scripts/bench_collect.py (medians,
# min-max spread and the zblk/zram ratio of each round).
#
# Usage: tools/scripts/bench-device.sh [--out DIR] [--boots N] [--rounds N]
#                                      [--pairs ZBLKALGO:ZRAMALGO+...] [--mem SIZE]
#   --out DIR     where the console logs and results.json go
#                 (default bench-out/device, git-ignored)
#   --boots N     guest boots (default 1); rounds of all boots are pooled
#   --rounds N    rounds per boot (default 3)
#   --pairs P     codec pairs zblk:zram, '+' separated (default lz4:lz4+zstd:zstd)
#   --randio-s S  seconds of each random read / write run (default 4)
#   --randio-qd Q queue depths (randio --jobs), '+' separated (default 1+4)
#   --kernel K    guest kernel, 6.12 or 7.3 (default 6.12; tests/vm/run.sh --kernel)
#   --collect     only re-collect the console logs already in DIR
# Environment: ZBLK_VM_CACHE, ZBLK_VM_NOBUILD, ZBLK_VM_ACCEL as for run.sh;
# ZBLK_VM_ARGS is appended to the bench knobs. ZBLK_CORPUS: the page corpus
# (default ../shared/corpus/realmem-dev.bin.zst, skipped when missing).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=$REPO/bench-out/device
BOOTS=1
ROUNDS=3
PAIRS=lz4:lz4+zstd:zstd
RANDIO_S=4
RANDIO_QD=1+4
MEM=2G
KERNEL=6.12
COLLECT_ONLY=0
CORPUS=${ZBLK_CORPUS:-$REPO/../shared/corpus/realmem-dev.bin.zst}

die() { printf 'bench-device: %s\n' "$*" >&2; exit 2; }
log() { printf '[bench-device] %s\n' "$*" >&2; }

while [ $# -gt 0 ]; do
    case "$1" in
    --out) OUT=$2; shift 2;;
    --boots) BOOTS=$2; shift 2;;
    --rounds) ROUNDS=$2; shift 2;;
    --pairs) PAIRS=$2; shift 2;;
    --randio-s) RANDIO_S=$2; shift 2;;
    --randio-qd) RANDIO_QD=$2; shift 2;;
    --mem) MEM=$2; shift 2;;
    --kernel) KERNEL=$2; shift 2;;
    --collect) COLLECT_ONLY=1; shift;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0;;
    *) die "unknown option '$1' (see --help)";;
    esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CACHE=${ZBLK_VM_CACHE:-$REPO/.vmcache}

# Machine facts for the results file (the host, since the guest is emulated).
write_meta() {
    {
        echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "host_cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)"
        echo "host_cpus=$(nproc)"
        echo "host_mem=$(free -g 2>/dev/null | awk '/^Mem:/ { print $2 " GB" }')"
        echo "host_load=$(cut -d' ' -f1-3 /proc/loadavg)"
        echo "qemu=$(qemu-system-x86_64 --version 2>/dev/null | head -1)"
        echo "accel=${ZBLK_VM_ACCEL:-tcg}"
        echo "guest_kernel=$(cat "$CACHE/kernel-$KERNEL/version" 2>/dev/null)"
        echo "guest_mem=$MEM"
        echo "guest_cpus=2"
        echo "commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)$(git -C "$REPO" diff --quiet 2>/dev/null || echo -dirty)"
        echo "boots=$BOOTS"
        echo "rounds_per_boot=$ROUNDS"
        echo "pairs=$PAIRS"
        echo "randio_s=$RANDIO_S"
        echo "randio_qd=$RANDIO_QD"
        echo "vm_args=${ZBLK_VM_ARGS:-}"
    } >"$OUT/meta.txt"
}

run_boots() {
    local data=() b
    if [ -f "$CORPUS" ]; then
        zstd -qdcf "$CORPUS" >"$OUT/realmem.bin" || die "cannot decompress $CORPUS"
        data=(--data "$OUT/realmem.bin")
    else
        log "no corpus at $CORPUS: the corpus ratio is skipped"
    fi
    rm -f "$OUT"/console-*.log
    write_meta
    for b in $(seq 1 "$BOOTS"); do
        log "boot $b of $BOOTS: $ROUNDS rounds, pairs $PAIRS"
        # The scenario is long: lift its per-scenario limit and the boot's.
        local limit=$((ROUNDS * 900 + 300))
        ZBLK_VM_ARGS="zblk.timeout=$limit zblk.bench_rounds=$ROUNDS zblk.bench_pairs=$PAIRS zblk.bench_randio_s=$RANDIO_S zblk.bench_randio_qd=$RANDIO_QD ${ZBLK_VM_ARGS:-}" \
            bash "$REPO/tests/vm/run.sh" --kernel "$KERNEL" --scenario bench --mem "$MEM" --timeout $((limit + 120)) \
            "${data[@]+"${data[@]}"}" || die "boot $b failed (see $CACHE/last-console-$KERNEL.log)"
        cp "$CACHE/last-console-$KERNEL.log" "$OUT/console-$b.log"
        # Build once: the later boots reuse the binaries.
        export ZBLK_VM_NOBUILD=1
    done
    rm -f "$OUT/realmem.bin"
}

[ "$COLLECT_ONLY" = 1 ] || run_boots
python3 "$HERE/bench_collect.py" --meta "$OUT/meta.txt" --out "$OUT/results.json" \
    --markdown "$OUT/tables.md" "$OUT"/console-*.log
log "results: $OUT/results.json"
