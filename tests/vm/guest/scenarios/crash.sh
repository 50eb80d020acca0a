# crash: kill -9 of the daemon of an ACTIVE SWAP device, ZBLK_CRASH_KILLS
# times (default 6) at random moments, while usemem swaps several hundred
# MB through it under a memory cgroup and verifies every page. The keeper
# starts a new daemon after each kill, which recovers the store from its
# memfd and takes the device over (USER_RECOVERY_REISSUE). Pass: usemem ends
# with every page verified (no SIGBUS/SIGSEGV, no bad page), `zblk stat`
# shows recoveries = kills, and the memory falls back to its baseline once
# the workload is gone. Prints kill-to-live (keeper) and kill-to-first-
# request (daemon log) times, median and max.
#
# In run.sh's default list (before swapkill; about 1-2 min under TCG); alone:
#   bash tests/vm/run.sh --scenario crash
# Another swap area (a dead one that swapkill leaves, say) would take part
# of the workload's pages and its errors: this scenario needs its own alone.
grep -q "(deleted)" /proc/swaps && fail "a dead swap area from an earlier scenario is active (run swapkill last)"
# Kernel messages from here on are this scenario's (lifecycle's kill -9 of a
# --no-recovery device logs I/O errors before it, on purpose).
DMESG_FROM=$(( $(dmesg | wc -l) + 1 ))
new_dmesg() { dmesg | tail -n +"$DMESG_FROM"; }
SCEN=crash
: "${ZBLK_CRASH_KILLS:=6}" "${ZBLK_CRASH_SEED:=$(cut -d. -f2 /proc/uptime)}"
zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --swap
[ "$(zstat | jget recovery)" = reissue ] || fail "device recovery is '$(zstat | jget recovery)', want reissue"
LOG=/run/zblk/$ZID.log
base=$(zstat | jnum mem_used_total)
CG=$(cg_make crash "$ZBLK_LIMIT_MB")
in_cg usemem --mb "$ZBLK_USEMEM_MB" --procs "$ZBLK_USEMEM_PROCS" --sleep 1 --passes 4 >/tmp/zblk-vm.usemem 2>&1 &
u=$!
track $u
# Let the workload reach swap before the first kill.
i=0
while [ "$(zstat | jnum stored_pages)" -lt 4096 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
kills=0 live_ms="" first_ms="" peak=0 n=0
while [ $kills -lt "$ZBLK_CRASH_KILLS" ] && kill -0 $u 2>/dev/null; do
    n=$((n + 1))
    sleep "$(awk -v s="$ZBLK_CRASH_SEED" -v n=$n 'BEGIN { srand(s + n); printf "%.1f", 0.5 + rand() * 2.5 }')"
    st=$(zstat | jnum stored_pages); [ "$st" -gt "$peak" ] && peak=$st
    pid=$(zdaemon_pid "$ZID") || continue
    taken=$(grep -c 'took over in' "$LOG")
    served=$(grep -c 'first request served at uptime' "$LOG")
    t=$(now)
    kill -9 "$pid" || continue
    kills=$((kills + 1))
    # The keeper says when the new daemon serves; its first request follows.
    i=0
    while [ "$(grep -c 'took over in' "$LOG")" -le "$taken" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    [ $i -lt 300 ] || fail "kill $kills: no new daemon within 30 s: $(tail -3 "$LOG" | tr '\n' '|')"
    grep -q 'giving up' "$LOG" && fail "kill $kills: the keeper gave up: $(grep 'giving up' "$LOG")"
    ms=$(grep 'took over in' "$LOG" | tail -1 | sed 's/.*took over in \([0-9]*\) ms.*/\1/')
    live_ms="$live_ms $ms"
    i=0
    while [ "$(grep -c 'first request served at uptime' "$LOG")" -le "$served" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    up=$(grep 'first request served at uptime' "$LOG" | tail -1 | sed 's/.*at uptime \([0-9.]*\).*/\1/')
    [ -n "$up" ] && [ $i -lt 100 ] && first_ms="$first_ms $(awk -v a="$t" -v b="$up" 'BEGIN { printf "%d", (b - a) * 1000 }')"
    log "kill $kills of pid $pid with $st pages stored: new daemon live in ${ms} ms"
done
[ $kills -ge 5 ] || fail "only $kills kills before the workload ended (want >= 5): raise zblk.usemem_mb"
wait $u
urc=$?
uj=$(grep '"program":"usemem"' /tmp/zblk-vm.usemem | tail -1)
[ "$urc" = 0 ] || fail "usemem exit $urc after $kills kills: $(tail -c 400 /tmp/zblk-vm.usemem | tr '\n' ' ')"
[ "$(echo "$uj" | jget ok)" = true ] || fail "usemem not ok: $uj"
[ "$(echo "$uj" | jnum bad_pages)" = 0 ] || fail "usemem saw bad pages: $uj"
new_dmesg | grep -qiE 'segfault|SIGBUS|I/O error, dev ublkb|(read|write)-error on swap' && fail "kernel saw errors: $(new_dmesg | grep -iE 'segfault|SIGBUS|I/O error|-error on swap' | tail -2 | tr '\n' '|')"
rec=$(zstat | jnum recoveries)
[ "$rec" = "$kills" ] || fail "stat shows recoveries=$rec after $kills kills"
# Back to the baseline: swap slots of the exited workload are discarded.
rmdir "$CG" 2>/dev/null
i=0
while :; do
    mem=$(zstat | jnum mem_used_total)
    [ $((mem - base)) -le $((1048576 + peak * 4096 / 50)) ] && break
    [ $i -lt 200 ] || fail "memory did not fall back: baseline $base, now $mem (stored $(zstat | jnum stored_pages))"
    sleep 0.1; i=$((i + 1))
done
stats() { echo "$1" | tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { if (NR) printf "median=%d max=%d n=%d", v[int((NR + 1) / 2)], v[NR], NR; else printf "n=0" }'; }
pass "kills=$kills recoveries=$rec usemem_ok bad_pages=0 total_mb=$(echo "$uj" | jget total_mb) peak_stored_pages=$peak mem=$base->$mem kill_to_live_ms: $(stats "$live_ms") kill_to_first_request_ms: $(stats "$first_ms")"
