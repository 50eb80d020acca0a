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
case $rounds in '' | *[!0-9]* | 0) die "--rounds takes a positive number" ;; esac
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

# A build is named by its commit; the working tree's with -dirty when it
# differs from HEAD.
head=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- || head=$head-dirty
tags=$head
build "$REPO" "$head"
if [ -n "$against" ]; then
    git worktree add -q --detach "$work/tree" "$against" || die "no commit $against"
    tag=$(git rev-parse --short "$against")
    build "$work/tree" "$tag"
    tags="$tags $tag"
fi

# The guest's part: every round runs each build's programs in turn.
cat >"$work/extra.sh" <<EOF
C=/lib/zblk-vm/data/$(basename "$CORPUS")
# Runs program \$1 of build \$2 in round \$3 with the rest as arguments,
# every line of its output prefixed; a failure is a FAIL line and exit 1.
run() {
    p=\$1 t=\$2 r=\$3
    shift 3
    if \${p}_\$t "\$@" >/tmp/out 2>&1; then
        sed "s/^/\$t \$p round \$r /" /tmp/out
    else
        rc=\$?
        tail -n 5 /tmp/out
        echo "FAIL guest-engine \${p}_\$t exited \$rc in round \$r"
        exit 1
    fi
}
r=1
while [ \$r -le $rounds ]; do
    for t in $tags; do
        run engine_ratios \$t \$r \$C --rounds 1 lz4
        run native_zram \$t \$r \$C --zram zram0 --zram-algos lz4 --rounds 1 --copies 1
    done
    r=\$((r + 1))
done
echo "PASS guest-engine rounds=$rounds builds: $tags"
EOF

carry=()
for f in "$work"/native_zram_* "$work"/engine_ratios_*; do carry+=(--carry "$f"); done
# The guest's own limit on a script (zblk.timeout, seconds) and qemu's.
ZBLK_VM_ARGS="zblk.timeout=$((600 * rounds + 300)) ${ZBLK_VM_ARGS:-}" \
    bash tests/vm/run.sh --kernel "$kernel" --scenario stat --extra-script "$work/extra.sh" \
    --data "$CORPUS" "${carry[@]}" --timeout $((600 * rounds + 900)) 2>&1 |
    grep -E '^[0-9a-f]{7,}(-dirty)? (engine_ratios|native_zram) round [0-9]+ \| (lz4|zblk|zram) |^(PASS|FAIL|ALL)|^\[vm\] (error|warning)|^console logs'
