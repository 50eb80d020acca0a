# exhaust: memory exhaustion with a full swap device. usemem over-commits a
# memory cgroup (memory.max) whose swap, a zblk device, is smaller than the
# overflow, until the OOM killer acts. Two parts, each on a new device:
#   limit:    --mem-limit far below what the device's size would take, so
#             the device refuses writes (ENOSPC) before it is full;
#   nolimit:  no limit, the device fills up as swap.
# Pass, in both: the OOM killer killed usemem processes and nothing else
# (never the daemon or its keeper, which run with oom_score_adj -1000,
# never init); the usemem workers that survived verified every page; the
# guest's watchdog never stalled; the daemon and keeper live on; `stat`
# shows the refusals (failed_writes > 0 and mem_used_max within mem_limit
# with the limit; without, no failed write and, in the OOM report, swap
# filled to >= 85 % of the device);
# after swapoff the device stores nothing and serves a verified write and
# read; the memory falls back to its baseline.
#
# Knobs (zblk.<knob>=VALUE): exhaust_dev_mb=128 (device), exhaust_cg_mb=160
# (memory.max), exhaust_limit_mb=16 (--mem-limit of the first part),
# exhaust_procs=3 and exhaust_mb=160 (usemem: 480 MB against 160 + 128).
: "${ZBLK_EXHAUST_DEV_MB:=128}" "${ZBLK_EXHAUST_CG_MB:=160}" "${ZBLK_EXHAUST_LIMIT_MB:=16}"
: "${ZBLK_EXHAUST_PROCS:=3}" "${ZBLK_EXHAUST_MB:=160}"
[ $((ZBLK_EXHAUST_PROCS * ZBLK_EXHAUST_MB)) -gt $((ZBLK_EXHAUST_CG_MB + ZBLK_EXHAUST_DEV_MB)) ] ||
    fail "the workload ($ZBLK_EXHAUST_PROCS x $ZBLK_EXHAUST_MB MB) fits in memory.max + swap: no exhaustion"
grep -q "(deleted)" /proc/swaps && fail "a dead swap area from an earlier scenario is active (run swapkill last)"
[ -z "$(tail -n +2 /proc/swaps)" ] || fail "another swap area is active: $(tail -n +2 /proc/swaps | tr '\n' '|')"

# Checks that every OOM kill since dmesg_mark hit usemem, never init, the
# daemon ($1) or the keeper ($2); sets KILLS (their count).
check_kills() {
    local k pid comm
    k=$(oom_kills)
    [ -n "$k" ] || fail "$LABEL: the OOM killer never acted: $(dmesg_new | grep -iE 'oom|killed' | tail -2 | tr '\n' '|')"
    KILLS=$(echo "$k" | wc -l)
    echo "$k" | while read -r pid comm; do
        case "$pid" in 1 | "$1" | "$2") echo "FAIL $SCEN $LABEL: the OOM killer killed pid $pid ($comm): init, the daemon or the keeper"; exit 1;; esac
        [ "$comm" = usemem ] || { echo "FAIL $SCEN $LABEL: the OOM killer killed pid $pid ($comm), not usemem"; exit 1; }
    done || exit 1
}

# One part: $1 its label, the rest more `zblk add` flags. Sets FIGS.
part() {
    LABEL=$1
    shift
    dmesg_mark
    zadd --size "${ZBLK_EXHAUST_DEV_MB}M" --algo "$ZBLK_ALGO" --swap "$@"
    is_swap "$ZDEV" || fail "$LABEL: $ZDEV is not in /proc/swaps"
    local dpid kpid base limit urc uj st fw used peak swap_kb=-
    dpid=$(zdaemon_pid "$ZID") || fail "$LABEL: no daemon holds /dev/ublkc$ZID"
    kpid=$(zkeeper_pid "$ZID") || fail "$LABEL: no keeper for device $ZID"
    for p in "$dpid" "$kpid"; do
        [ "$(cat "/proc/$p/oom_score_adj")" = -1000 ] || fail "$LABEL: pid $p ($(cat "/proc/$p/comm")) has oom_score_adj $(cat "/proc/$p/oom_score_adj"), want -1000"
    done
    base=$(zstat | jnum mem_used_total)
    limit=$(zstat_store mem_limit)
    CG=$(cg_make "exhaust-$LABEL" "$ZBLK_EXHAUST_CG_MB" "$ZBLK_EXHAUST_CG_MB")
    watchdog_start
    rm -f /tmp/zblk-vm.peak
    in_cg usemem --mb "$ZBLK_EXHAUST_MB" --procs "$ZBLK_EXHAUST_PROCS" --sleep 1 >/tmp/zblk-vm.usemem 2>&1 &
    upid=$!
    track $upid
    sample_peak $upid zblk
    wait $upid
    urc=$?
    watchdog_check
    uj=$(grep '"program":"usemem"' /tmp/zblk-vm.usemem | tail -1)
    [ -n "$uj" ] || fail "$LABEL: usemem (exit $urc) printed no result: $(tail -c 300 /tmp/zblk-vm.usemem | tr '\n' ' ')"
    [ "$(echo "$uj" | jnum bad_pages)" = 0 ] || fail "$LABEL: a surviving usemem worker saw bad pages: $uj"
    [ "$urc" != 0 ] || fail "$LABEL: usemem ended well (exit 0): the workload was not exhausted"
    check_kills "$dpid" "$kpid"
    kill -0 "$dpid" 2>/dev/null || fail "$LABEL: daemon $dpid is gone"
    kill -0 "$kpid" 2>/dev/null || fail "$LABEL: keeper $kpid is gone"
    [ "$(zdaemon_pid "$ZID")" = "$dpid" ] || fail "$LABEL: another daemon serves the device now"
    dmesg_new | grep -qiE 'read-error on swap|segfault|SIGBUS' &&
        fail "$LABEL: the kernel saw read errors or faults: $(dmesg_new | grep -iE 'read-error on swap|segfault|SIGBUS' | tail -2 | tr '\n' '|')"
    st=$(zstat) || fail "$LABEL: zblk stat failed after the OOM kills"
    fw=$(echo "$st" | jnum failed_writes)
    [ "$(echo "$st" | jnum failed_reads)" = 0 ] || fail "$LABEL: failed_reads $(echo "$st" | jnum failed_reads)"
    peak=$(jnum stored_pages </tmp/zblk-vm.peak)
    used=$(echo "$st" | jnum mem_used_max)
    if [ "$limit" -gt 0 ]; then
        [ "$fw" -gt 0 ] || fail "$LABEL: no failed write although the ${ZBLK_EXHAUST_LIMIT_MB} MB limit was reached (mem_used_max $used)"
        [ "$used" -le "$limit" ] || fail "$LABEL: mem_used_max $used is above mem_limit $limit"
        dmesg_new | grep -qi 'write-error on swap' || log "note: no 'Write-error on swap-device' in dmesg"
    else
        [ "$fw" = 0 ] || fail "$LABEL: $fw failed writes without a memory limit"
        # The OOM report's own figure (memory cgroup OOM: "swap: usage NkB"):
        # stat, sampled once a second, misses the last second before it.
        swap_kb=$(dmesg_new | sed -n 's/.*swap: usage \([0-9]*\)kB.*/\1/p' | sort -n | tail -1)
        [ "${swap_kb:-0}" -ge $((ZBLK_EXHAUST_DEV_MB * 1024 * 85 / 100)) ] ||
            fail "$LABEL: swap held at most ${swap_kb:-?} kB of the $ZBLK_EXHAUST_DEV_MB MB device when the OOM killer acted: it never filled up"
    fi
    rmdir "$CG" 2>/dev/null
    # What the killed and the finished workers left in swap is freed by now.
    must swapoff "$ZDEV"
    must blkdiscard -f "$ZDEV"
    wait_no_pages "$ZID" 100
    wait_mem_back "$ZID" "$base" "$peak" 100
    dev_verify_rw "$ZDEV" 8
    [ "$(zstat | jnum failed_reads)" = 0 ] || fail "$LABEL: failed_reads after the verified I/O"
    must zblk del -n "$ZID"
    FIGS="$LABEL: oom_kills=$KILLS usemem_exit=$urc bad_pages=0 peak_stored_pages=$peak oom_swap_kb=$swap_kb failed_writes=$fw mem_used_max=$used mem_limit=$limit watchdog_max_gap_s=$WATCHDOG_GAP verified_rw_mb=8 mem=$base->$MEM"
    log "$FIGS"
}

part limit --mem-limit "${ZBLK_EXHAUST_LIMIT_MB}M"
f1=$FIGS
part nolimit
pass "$f1; $FIGS"
