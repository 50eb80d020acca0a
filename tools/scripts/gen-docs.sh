#!/usr/bin/env bash
# Writes zblk's man pages (zblk.1, zblk-SUB.1 per subcommand) and shell
# completions (completions/zblk.bash, _zblk, zblk.fish) into OUTDIR, from
# the clap definitions of the binary itself (its hidden `gen-docs`
# subcommand), so that they say what --help says.
#
#   tools/scripts/gen-docs.sh OUTDIR          # builds and runs the zblk of this tree
#   ZBLK=/path/to/zblk tools/scripts/gen-docs.sh OUTDIR   # that binary instead
#
# Nothing it writes is committed: packaging runs it at build time.
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
out=$1
root=$(cd "$(dirname "$0")/../.." && pwd)

if [ -n "${ZBLK:-}" ]; then
    "$ZBLK" gen-docs "$out" >/dev/null
else
    cargo run --quiet --manifest-path "$root/Cargo.toml" -p zblk-tools --bin zblk -- gen-docs "$out" >/dev/null
fi
echo "man pages and completions in $out:"
ls "$out" "$out/completions"
