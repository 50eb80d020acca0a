# upgrade: `zblk restart` (a deliberate handover to a new daemon started from
# the binary at the same path, no swapoff) ZBLK_UPGRADE_RESTARTS times
# (default 3) while usemem swaps through the device and verifies every page.
# On 6.12 (no UBLK_F_QUIESCE) the old daemon just exits and the driver
# reissues its requests to the new one; with QUIESCE the driver drains them
# first. Pass: usemem verified every page, `stat` shows the restarts as
# recoveries, memory back to the baseline after the workload, and what
# `zblk set` changed before the first restart (memory limit, writeback
# limit, idle policy) still in force after the last. With lz4, lz4hc or
# zstd the device has a dictionary (--algo-params) whose file is removed
# before the first restart, and `zblk dict train` makes one while usemem runs.
#
# In run.sh's default list (before swapkill); alone:
#   bash tests/vm/run.sh --scenario upgrade
SCEN=upgrade
: "${ZBLK_UPGRADE_RESTARTS:=3}"
# With an algorithm that takes one, the device gets a dictionary whose file
# is gone before the first restart: every new daemon must decode with the
# store's copy (usemem verifies every page).
DICT=/tmp/zblk-upgrade.dict
case "$ZBLK_ALGO" in
lz4 | lz4hc* | zstd*)
    head -c 16384 "$(command -v zblk)" >"$DICT"
    handover_start 3 --algo-params "dict=$DICT"
    rm -f "$DICT"
    ;;
*) handover_start 3 ;;
esac
# Settings changed at run time must outlive the daemons: the store keeps
# them for the next one. The policy's age is an hour, so it does nothing.
must zblk set -n "$ZID" --mem-limit 900M --writeback-limit 4321
must zblk set -n "$ZID" --recompress-idle-after 3600 --recompress-algo zstd:3
# A dictionary made from the device's own pages (handover_start waited for
# 4096 stored): whole pages, at most --size.
out=$(zblk dict train -n "$ZID" --size 32K -o /tmp/zblk-trained.dict 2>&1) || fail "dict train: $out"
tb=$(($(wc -c </tmp/zblk-trained.dict)))
[ "$tb" -gt 0 ] && [ $((tb % 4096)) = 0 ] && [ "$tb" -le 32768 ] || fail "dict train wrote $tb bytes"
n=0 PEAK=0 took=""
while [ $n -lt "$ZBLK_UPGRADE_RESTARTS" ] && kill -0 $U 2>/dev/null; do
    sleep 2
    st=$(zstat | jnum stored_pages); [ "$st" -gt "$PEAK" ] && PEAK=$st
    old_pid=$(zdaemon_pid "$ZID")
    out=$(zblk restart -n "$ZID" 2>&1) || fail "restart $((n + 1)): $out; old daemon $old_pid: $(proc_stacks "$old_pid" | tr '\n' '|')"
    n=$((n + 1))
    took="$took $(echo "$out" | sed 's/.* in \([0-9]*\) ms.*/\1/')"
    log "restart $n with $st pages stored: $out"
done
[ $n -ge "$ZBLK_UPGRADE_RESTARTS" ] || fail "only $n restarts before the workload ended"
handover_finish "$n" restarts
zblk list | grep -q "live" || fail "zblk list does not show the device live: $(zblk list | tr '\n' '|')"
lim=$(zstat_store mem_limit) wbl=$(zstat_store writeback_limit) dev_lim=$(zstat | jnum mem_limit)
ria=$(zstat_policy recompress_idle_after) ralgo=$(zstat_policy recompress_algo)
[ "$lim" = $((900 << 20)) ] && [ "$dev_lim" = "$lim" ] && [ "$wbl" = 4321 ] ||
    fail "limits set before the restarts lost: mem_limit $lim (device $dev_lim), writeback_limit $wbl"
[ "$ria" = 3600 ] && [ "$ralgo" = zstd:3 ] ||
    fail "idle policy set before the restarts lost: recompress_idle_after '$ria' algo '$ralgo'"
pass "restarts=$n dict_trained=$tb recoveries=$REC usemem_ok bad_pages=0 total_mb=$(echo "$UJ" | jget total_mb) mem=$BASE->$MEM handover_ms:$took"
