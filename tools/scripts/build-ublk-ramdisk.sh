#!/usr/bin/env bash
# tools/scripts/build-ublk-ramdisk.sh: builds libublk's own ramdisk example
# (examples/ramdisk.rs of the libublk release zblk uses: one queue, depth
# 128, copies each request between the tag's buffer and a zeroed RAM area,
# as zblk's classic transport copies), statically, for the transport A/B
# in the guest (tests/vm/guest/scenarios/breakdown.sh, kind ramdisk), and
# prints the binary's path. The example's source is the one cargo fetched
# for zblk's build; it is built in a copy, with its dev-dependencies.
#
# Usage: bash tests/vm/run.sh --carry "$(tools/scripts/build-ublk-ramdisk.sh)" \
#            --scenario breakdown ...   (ZBLK_VM_ARGS zblk.bd_configs=ramdisk:none,...)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
die() { echo "build-ublk-ramdisk: $*" >&2; exit 1; }

manifest=$(cargo metadata --format-version 1 2>/dev/null | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "libublk":
        print(p["manifest_path"])
        break
') || die "cargo metadata failed (run cargo fetch first)"
[ -n "$manifest" ] || die "libublk is not among zblk's dependencies"

tdir=${CARGO_TARGET_DIR:-$REPO/target}
src=$tdir/libublk-src
rm -rf "$src"
cp -r "$(dirname "$manifest")" "$src"
# A package of its own, not a member of the workspace it now sits in.
printf '\n[workspace]\n' >>"$src/Cargo.toml"
target=$(rustc -vV | sed -n 's/^host: //p')
# The example's own lock file is made fresh here: it is not one of zblk's.
(cd "$src" && RUSTFLAGS='-C target-feature=+crt-static' \
    cargo build --release --example ramdisk --target "$target" \
    --target-dir "$tdir/libublk-examples") >&2 || die "cargo build of libublk's ramdisk example failed"
bin=$tdir/libublk-examples/$target/release/examples/ramdisk
[ -x "$bin" ] || die "no $bin after the build"
echo "$bin"
