#!/bin/sh
# RUSTC_WRAPPER for the fuzz build (fuzz/run.sh): compiles lz4_flex and
# zblk-lz4 (where zblk's lz4 compressor is generated, see lz4/src/lib.rs)
# without libFuzzer's coverage instrumentation, every other crate as
# cargo-fuzz asks. Comparison tracing inside lz4's match loop was 40-45 %
# of the store targets' time and steered the fuzzer through lz4_flex, not
# zblk. The flag goes last because LLVM takes the last value of an option
# (cargo puts RUSTFLAGS, where cargo-fuzz's -sanitizer-coverage-level=4
# is, before anything a wrapper adds); level 0 turns off every kind of
# coverage, comparison tracing included. AddressSanitizer stays on.
# $1 is rustc, the rest its arguments.
prev=
for a in "$@"; do
    if [ "$prev" = --crate-name ]; then
        case $a in
        lz4_flex | zblk_lz4) exec "$@" -Cllvm-args=-sanitizer-coverage-level=0 ;;
        esac
    fi
    prev=$a
done
exec "$@"
