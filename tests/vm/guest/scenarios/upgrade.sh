# upgrade: `zblk restart` (a deliberate handover to a new daemon started from
# the binary at the same path, no swapoff) ZBLK_UPGRADE_RESTARTS times
# (default 3) while usemem swaps through the device and verifies every page.
# On 6.12 (no UBLK_F_QUIESCE) the old daemon just exits and the driver
# reissues its requests to the new one; with QUIESCE the driver drains them
# first. Pass: usemem verified every page, `stat` shows the restarts as
# recoveries, memory back to the baseline after the workload.
#
# In run.sh's default list (before swapkill); alone:
#   bash tests/vm/run.sh --scenario upgrade
# Another swap area (a dead one that swapkill leaves, say) would take part
# of the workload's pages and its errors: this scenario needs its own alone.
grep -q "(deleted)" /proc/swaps && fail "a dead swap area from an earlier scenario is active (run swapkill last)"
SCEN=upgrade
: "${ZBLK_UPGRADE_RESTARTS:=3}"
zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --swap
base=$(zstat | jnum mem_used_total)
CG=$(cg_make upgrade "$ZBLK_LIMIT_MB")
in_cg usemem --mb "$ZBLK_USEMEM_MB" --procs "$ZBLK_USEMEM_PROCS" --sleep 1 --passes 3 >/tmp/zblk-vm.usemem 2>&1 &
u=$!
track $u
i=0
while [ "$(zstat | jnum stored_pages)" -lt 4096 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
n=0 peak=0 took=""
while [ $n -lt "$ZBLK_UPGRADE_RESTARTS" ] && kill -0 $u 2>/dev/null; do
    sleep 2
    st=$(zstat | jnum stored_pages); [ "$st" -gt "$peak" ] && peak=$st
    out=$(zblk restart -n "$ZID" 2>&1) || fail "restart $((n + 1)): $out"
    n=$((n + 1))
    took="$took $(echo "$out" | sed 's/.* in \([0-9]*\) ms.*/\1/')"
    log "restart $n with $st pages stored: $out"
done
[ $n -ge "$ZBLK_UPGRADE_RESTARTS" ] || fail "only $n restarts before the workload ended"
wait $u
urc=$?
uj=$(grep '"program":"usemem"' /tmp/zblk-vm.usemem | tail -1)
[ "$urc" = 0 ] || fail "usemem exit $urc after $n restarts: $(tail -c 400 /tmp/zblk-vm.usemem | tr '\n' ' ')"
[ "$(echo "$uj" | jget ok)" = true ] && [ "$(echo "$uj" | jnum bad_pages)" = 0 ] || fail "usemem: $uj"
rec=$(zstat | jnum recoveries)
[ "$rec" = "$n" ] || fail "stat shows recoveries=$rec after $n restarts"
zblk list | grep -q "live" || fail "zblk list does not show the device live: $(zblk list | tr '\n' '|')"
rmdir "$CG" 2>/dev/null
i=0
while :; do
    mem=$(zstat | jnum mem_used_total)
    [ $((mem - base)) -le $((1048576 + peak * 4096 / 50)) ] && break
    [ $i -lt 200 ] || fail "memory did not fall back: baseline $base, now $mem"
    sleep 0.1; i=$((i + 1))
done
pass "restarts=$n recoveries=$rec usemem_ok bad_pages=0 total_mb=$(echo "$uj" | jget total_mb) mem=$base->$mem handover_ms:$took"
