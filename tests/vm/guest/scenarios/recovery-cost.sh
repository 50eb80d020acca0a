# recovery-cost: what surviving the daemon costs, measured in one boot.
#
# 1. Swap throughput with the store in shared memory (the default, which a
#    new daemon recovers) against private memory (--no-recovery), the same
#    swap workload as zram-compare, ZBLK_COST_ROUNDS pairs (default 3), the
#    order of each pair alternating so that neither always runs on a warmer
#    guest. The result carries the median of each shared/private ratio.
# 2. Recovery time by stored size: for each of ZBLK_RECOVERY_MB (default
#    "100 500 1000") a device gets that many MB of compressible pages
#    (randio --prefill), its daemon is killed, and the new daemon's log says
#    how long the store's recovery took and the keeper how long from the
#    kill to the device served again; 4 MB read back are checked against
#    what was read before the kill.
#
# Not in run.sh's default list (about 3-4 min under TCG); run it with:
#   bash tests/vm/run.sh --scenario recovery-cost
SCEN=recovery-cost
: "${ZBLK_COST_ROUNDS:=3}" "${ZBLK_RECOVERY_MB:=100 500 1000}"
ZBLK_RECOVERY_MB=$(echo "$ZBLK_RECOVERY_MB" | tr '+,' '  ')

# One swap workload on a fresh device; $1 names it, the rest are add flags.
one() {
    local kind=$1
    shift
    zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --swap "$@"
    swap_workload "$kind"
    must zblk del -n "$ZID" --force >/dev/null
}

walls="" writes="" verifies=""
round=1
while [ "$round" -le "$ZBLK_COST_ROUNDS" ]; do
    if [ $((round % 2)) = 1 ]; then
        one private --no-recovery; PRIV=$W_FIGS
        one shared; SHARED=$W_FIGS
    else
        one shared; SHARED=$W_FIGS
        one private --no-recovery; PRIV=$W_FIGS
    fi
    # (Names of their own: the workload's helpers use short globals.)
    w=$(ratio "$(get "$SHARED" wall_s)" "$(get "$PRIV" wall_s)")
    o=$(ratio "$(get "$SHARED" write_mb_s)" "$(get "$PRIV" write_mb_s)")
    v=$(ratio "$(get "$SHARED" verify_mb_s)" "$(get "$PRIV" verify_mb_s)")
    walls="$walls $w" writes="$writes $o" verifies="$verifies $v"
    log "round $round shared/private: wall=$w swapout_mb_s=$o swapin_verify_mb_s=$v | private: $PRIV | shared: $SHARED"
    round=$((round + 1))
done
res="rounds=$ZBLK_COST_ROUNDS shared/private medians: swap_wall=$(echo "$walls" | median)"
res="$res swapout_mb_s=$(echo "$writes" | median) swapin_verify_mb_s=$(echo "$verifies" | median) |"

for mb in $ZBLK_RECOVERY_MB; do
    zadd --size "$((mb + 64))M" --algo "$ZBLK_ALGO"
    LOG=/run/zblk/$ZID.log
    randio --dev "$ZDEV" --mb "$mb" --prefill --count 1 --write-pct 0 >/tmp/zblk-vm.randio 2>&1 ||
        fail "$mb MB: randio failed: $(tail -c 300 /tmp/zblk-vm.randio)"
    dd if="$ZDEV" of=/tmp/zblk-vm.before bs=1048576 count=4 skip=$((mb / 2)) iflag=direct 2>/dev/null || fail "$mb MB: read before the kill failed"
    st=$(zstat | jnum stored_pages) mem=$(zstat | jnum mem_used_total)
    [ "$st" -ge $((mb * 256 * 9 / 10)) ] || fail "$mb MB: only $st pages stored after the prefill"
    taken=$(takeovers "$LOG")
    pid=$(zdaemon_pid "$ZID") || fail "$mb MB: no process holds /dev/ublkc$ZID"
    kill -9 "$pid"
    wait_takeover "$LOG" "$taken" 600 || fail "$mb MB: no new daemon within 60 s: $(tail -3 "$LOG" | tr '\n' '|')"
    live=$(last_takeover_ms "$LOG")
    store=$(grep 'store recovered in' "$LOG" | tail -1 | sed 's/.*store recovered in \([0-9]*\) ms.*/\1/')
    pinned=$(grep 'took over in' "$LOG" | tail -1 | sed -n 's/.*(\([0-9]*\) MB pinned.*/\1/p')
    dd if="$ZDEV" of=/tmp/zblk-vm.after bs=1048576 count=4 skip=$((mb / 2)) iflag=direct 2>/dev/null || fail "$mb MB: read after the recovery failed"
    cmp -s /tmp/zblk-vm.before /tmp/zblk-vm.after || fail "$mb MB: data read after the recovery differs"
    st2=$(zstat | jnum stored_pages)
    [ "$st2" = "$st" ] || fail "$mb MB: $st pages stored before the kill, $st2 after"
    log "$mb MB: stored_pages=$st mem_used_total=$mem store_recovery_ms=$store kill_to_live_ms=$live pinned_mb=$pinned"
    res="$res ${mb}MB: store=${store}ms live=${live}ms pinned=${pinned}MB"
    must zblk del -n "$ZID" >/dev/null
done
pass "$res"
