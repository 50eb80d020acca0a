# bench: the device-level benchmarks of zblk against kernel zram, in one boot.
#
# Run by name only (tools/scripts/bench-device.sh drives it): it measures,
# and only fails when a workload fails (a bad page, a device that does not
# come up), never on a speed. For each round and each codec pair
# ZBLK_ALGO:ZRAM_ALGO of ZBLK_BENCH_PAIRS, each device in turn (the order
# alternates from round to round, so that drift of the emulated machine's
# speed does not always favour the same side):
#   swap    the usemem pressure workload of lib.sh (cgroup memory.high,
#           every page verified): elapsed, swap-out and swap-in+verify MB/s,
#           and the device's orig/compr and orig/mem_used_total at its peak
#   munmap  the munmap workload of lib.sh, ZBLK_MUNMAP_SIZES by one process,
#           then ZBLK_BENCH_MUNMAP_MULTI (PROCSxMB) by several processes at
#           once (first pair only: freeing does not depend on the codec)
#   corpus  the page corpus /lib/zblk-vm/data/*.bin (if carried with --data)
#           written with dd (O_DIRECT) to the raw device: orig, compr, mem_used_total
#           and the bytes written (zblk before 6d29a0e left same-filled pages out of orig)
#   randio  random 4 KB O_DIRECT reads, then writes, at each queue depth of
#           ZBLK_BENCH_RANDIO_QD (randio --jobs), on the raw device pre-filled
#           over ZBLK_BENCH_RANDIO_MB
#   zlat    zblk's own per-page latency percentiles (`zblk stat --json`) of
#           the swap device after swap+munmap, and of the raw device after randio
# Each figure is one line `BENCH {json}` on the console; the host script
# pairs zblk with zram of the same round and pair.
#
# Knobs (zblk.<knob>=VALUE): bench_rounds=1, bench_pairs=lz4:lz4+zstd:zstd,
# bench_randio_mb=32, bench_randio_s=4, bench_randio_qd=1+4,
# bench_munmap_multi=2x128 ('+' separated, empty for none), and lib.sh's
# dev_mb, limit_mb, usemem_procs, usemem_mb, munmap_sizes.
: "${ZBLK_BENCH_ROUNDS:=1}" "${ZBLK_BENCH_PAIRS:=lz4:lz4+zstd:zstd}"
: "${ZBLK_BENCH_RANDIO_MB:=32}" "${ZBLK_BENCH_RANDIO_S:=4}" "${ZBLK_BENCH_RANDIO_QD:=1+4}"
: "${ZBLK_BENCH_MUNMAP_MULTI=2x128}"
PAIRS=$(echo "$ZBLK_BENCH_PAIRS" | tr '+,' '  ')
RANDIO_QD=$(echo "$ZBLK_BENCH_RANDIO_QD" | tr '+,' '  ')
MUNMAP_RUNS="$(for mb in $ZBLK_MUNMAP_SIZES; do printf '1x%s ' "$mb"; done)$(echo "$ZBLK_BENCH_MUNMAP_MULTI" | tr '+,' '  ')"
CORPUS=$(ls /lib/zblk-vm/data/*.bin 2>/dev/null | head -1)

# Prints one result line: BENCH {"round":..,"pair":..,"kind":..,"algo":..,"test":..,<$1>}.
emit() { echo "BENCH {\"round\":$R,\"pair\":\"$PAIR\",\"kind\":\"$KIND\",\"algo\":\"$ALGO\",\"test\":\"$TEST\",$1}"; }
# A number for JSON: the value, or null when empty or not numeric.
num() { case "$1" in '' | inf | *[!0-9.e+-]*) echo null;; *) echo "$1";; esac; }

# The "latency" object of zblk stat --json of device $ZID, on one line.
zlat_json() {
    zstat | tr -d ' \n' | grep -o '"latency":{"write":{[^}]*},"read":{[^}]*},"discard":{[^}]*}}' |
        sed 's/^"latency"://'
}

# Brings up the swap device of KIND with ALGO.
swap_up() {
    if [ "$KIND" = zram ]; then ZBLK_ALGO=$ALGO zram_swap "$ZBLK_DEV_MB"
    else zadd --size "${ZBLK_DEV_MB}M" --algo "$ALGO" --swap; fi
}
# Takes the device of KIND down again (swap or raw).
dev_down() {
    if [ "$KIND" = zram ]; then
        is_swap /dev/zram0 && { swapoff /dev/zram0 || fail "swapoff /dev/zram0 failed"; }
        echo 1 >/sys/block/zram0/reset
    else
        must zblk del -n "$ZID" --force >/dev/null
    fi
}
# A raw (not swap) device of KIND with ALGO; sets RAW to its path.
raw_up() {
    if [ "$KIND" = zram ]; then
        zram_make "$ALGO" "$ZBLK_DEV_MB"
        RAW=/dev/zram0
    else
        zadd --size "${ZBLK_DEV_MB}M" --algo "$ALGO"
        RAW=$ZDEV
    fi
}

bench_swap() {
    TEST=swap
    swap_up
    swap_workload "$KIND"
    emit "\"wall_s\":$(num "$W_WALL"),\"swapout_mb_s\":$(num "$W_WRITE"),\"swapin_verify_mb_s\":$(num "$W_VERIFY"),\"swapout_mb\":$W_OUT_MB,\"swapin_mb\":$W_IN_MB,\"ratio_data\":$(num "$W_RATIO"),\"ratio_mem\":$(num "$W_MEMRATIO")"
    if [ "$MUNMAP" = 1 ]; then
        TEST=munmap
        procs0=$ZBLK_MUNMAP_PROCS
        for run in $MUNMAP_RUNS; do
            procs=${run%%x*} mb=${run#*x}
            ZBLK_MUNMAP_PROCS=$procs
            munmap_workload "$KIND" "$mb"
            ms=$(echo "$M_FIGS" | grep -o 'munmap_ms=[0-9.]*' | cut -d= -f2)
            st=$(echo "$M_FIGS" | grep -o 'settle_s=[0-9.]*' | cut -d= -f2)
            emit "\"mb\":$mb,\"procs\":$procs,\"munmap_ms\":$(num "$ms"),\"settle_s\":$(num "$st")"
        done
        ZBLK_MUNMAP_PROCS=$procs0
    fi
    if [ "$KIND" = zblk ]; then
        TEST=zlat
        l=$(zlat_json); emit "\"phase\":\"swap\",\"latency\":${l:-null}"
    fi
    dev_down
}

bench_raw() {
    raw_up
    if [ -n "$CORPUS" ]; then
        TEST=corpus
        must dd if="$CORPUS" of="$RAW" bs=1M oflag=direct >/dev/null
        sync
        if [ "$KIND" = zram ]; then s=$(zram_mm); else s=$(zstat); fi
        orig=$(sample_orig "$KIND" "$s"); compr=$(sample_compr "$KIND" "$s"); mem=$(sample_memused "$KIND" "$s")
        [ "${orig:-0}" -gt 0 ] || fail "$KIND $ALGO: corpus written but orig_data_size is ${orig:-empty}"
        # zram counts same-filled pages in orig_data_size (zblk too since
        # 6d29a0e, not before): the bytes written are the common numerator.
        written=$(wc -c <"$CORPUS")
        emit "\"written\":$written,\"orig\":$orig,\"compr\":$compr,\"mem_used_total\":$mem,\"ratio_data\":$(num "$(ratio "$orig" "$compr")"),\"ratio_mem\":$(num "$(ratio "$orig" "$mem")")"
        must blkdiscard "$RAW"
    fi
    TEST=randio
    # All reads first: they check every page against generation 0 of the
    # pre-fill, which the writes would move on.
    pf=--prefill
    for mode in read write; do
        wp=0; [ $mode = write ] && wp=100
        for qd in $RANDIO_QD; do
            randio --dev "$RAW" --mb "$ZBLK_BENCH_RANDIO_MB" --write-pct $wp --seconds "$ZBLK_BENCH_RANDIO_S" \
                --jobs "$qd" $pf >/tmp/zblk-vm.randio 2>&1 ||
                fail "$KIND $ALGO randio $mode qd $qd: $(tail -c 300 /tmp/zblk-vm.randio)"
            pf=
            j=$(grep '"program":"randio"' /tmp/zblk-vm.randio | tail -1)
            [ -n "$j" ] || fail "$KIND $ALGO randio $mode qd $qd: no result: $(tail -c 300 /tmp/zblk-vm.randio)"
            emit "\"mode\":\"$mode\",\"jobs\":$qd,\"randio\":$j"
        done
    done
    if [ "$KIND" = zblk ]; then
        TEST=zlat
        l=$(zlat_json); emit "\"phase\":\"randio\",\"latency\":${l:-null}"
    fi
    dev_down
}

t_all=$(now)
R=1
while [ "$R" -le "$ZBLK_BENCH_ROUNDS" ]; do
    first=1
    for PAIR in $PAIRS; do
        MUNMAP=$first
        first=0
        order="zram zblk"
        [ $((R % 2)) = 0 ] && order="zblk zram"
        for KIND in $order; do
            if [ "$KIND" = zram ]; then ALGO=${PAIR#*:}; else ALGO=${PAIR%%:*}; fi
            log "round $R pair $PAIR: $KIND $ALGO"
            bench_swap
            bench_raw
        done
    done
    R=$((R + 1))
done
pass "rounds=$ZBLK_BENCH_ROUNDS pairs=$ZBLK_BENCH_PAIRS corpus=${CORPUS:-none} in $(elapsed "$t_all")s"
