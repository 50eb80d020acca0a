#!/usr/bin/env bash
# tools/scripts/bench-guest-engine.sh: the engine and kernel zram on the same
# real-memory pages inside the qemu guest (TCG), where the swap figures are
# taken: bench/examples/native_zram.rs (zram's whole write path against the
# engine, as tools/scripts/bench-native-zram.sh runs it natively) and
# engine_ratios (the engine against its bare codec), lz4, booted once per
# kernel. With --against COMMIT the same two programs are also built at
# COMMIT (in a git worktree) and every round runs both builds, alternating:
# an A/B of an engine change under emulation, in one boot.
#
# Usage: tools/scripts/bench-guest-engine.sh [--kernel 6.12|7.3] [--rounds N]
#            [--against COMMIT]
# The guest runs the short `stat` scenario, then these. Output: the rows of
# each program's tables, every line prefixed with the build
# (`HEAD` or the commit) and the program; the guest's console log is where
# tests/vm/run.sh says.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
die() { echo "bench-guest-engine: $*" >&2; exit 1; }

kernel=7.3 rounds=2 against=
while [ $# -gt 0 ]; do
    case $1 in
    --kernel) kernel=${2:?}; shift 2 ;;
    --rounds) rounds=${2:?}; shift 2 ;;
    --against) against=${2:?}; shift 2 ;;
    *) die "unknown option $1 (see the header)" ;;
    esac
done
CORPUS=${ZBLK_CORPUS:-$REPO/../shared/corpus/realmem-dev.bin.zst}
[ -f "$CORPUS" ] || die "no corpus at $CORPUS (set ZBLK_CORPUS)"

work=$(mktemp -d)
cleanup() {
    [ -z "$against" ] || git -C "$REPO" worktree remove --force "$work/tree" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# Builds native_zram and engine_ratios in $1 (a checkout) into $work as
# <program>_<tag>, stripped (the guest's initramfs lives in its RAM).
build() {
    local src=$1 tag=$2 tdir=$work/target-$2 p
    (cd "$src" && CARGO_TARGET_DIR=$tdir cargo build --release -q -p zblk-bench \
        --example native_zram --example engine_ratios) || die "build of $tag failed"
    for p in native_zram engine_ratios; do
        cp "$tdir/release/examples/$p" "$work/${p}_$tag"
        strip "$work/${p}_$tag"
    done
}

tags=HEAD
build "$REPO" HEAD
if [ -n "$against" ]; then
    git worktree add -q --detach "$work/tree" "$against" || die "no commit $against"
    tag=$(git rev-parse --short "$against")
    build "$work/tree" "$tag"
    tags="$tags $tag"
fi

# The guest's part: every round runs each build's programs in turn.
cat >"$work/extra.sh" <<EOF
C=/lib/zblk-vm/data/$(basename "$CORPUS")
[ -e /sys/block/zram0 ] || modprobe zram num_devices=1
r=1
while [ \$r -le $rounds ]; do
    for t in $tags; do
        engine_ratios_\$t \$C --rounds 1 lz4 2>&1 | grep '^| lz4' | sed "s/^/\$t engine_ratios round \$r /"
        native_zram_\$t \$C --zram zram0 --zram-algos lz4 --rounds 1 --copies 1 2>&1 |
            grep -E '^\| (zblk|zram)' | sed "s/^/\$t native_zram round \$r /"
    done
    r=\$((r + 1))
done
echo "PASS guest-engine rounds=$rounds builds: $tags"
EOF

carry=()
for f in "$work"/native_zram_* "$work"/engine_ratios_*; do carry+=(--carry "$f"); done
ZBLK_VM_NOBUILD=${ZBLK_VM_NOBUILD:-0} bash tests/vm/run.sh --kernel "$kernel" --scenario stat \
    --extra-script "$work/extra.sh" --data "$CORPUS" "${carry[@]}" --timeout 1800 2>&1 |
    grep -E '^(HEAD|[0-9a-f]{7,}) (engine_ratios|native_zram) round|^(PASS|FAIL|ALL)'
