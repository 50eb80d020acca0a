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
# Kills are at least ZBLK_CRASH_GAP_S (default 2.6) s after the previous
# daemon went live, plus up to 1.4 s at random: the keeper gives up on a
# crash loop (5 crashes within 10 s, keeper/policy.rs), and 5 kills of this
# test must never look like one, however fast the machine recovers. The
# lifecycle scenario's crash-loop check tests the policy itself.
#
# In run.sh's default list (before swapkill; about 1-2 min under TCG); alone:
#   bash tests/vm/run.sh --scenario crash
SCEN=crash
: "${ZBLK_CRASH_KILLS:=6}" "${ZBLK_CRASH_SEED:=$(cut -d. -f2 /proc/uptime)}" "${ZBLK_CRASH_GAP_S:=2.6}"
handover_start 8
[ "$(zstat | jget recovery)" = reissue ] || fail "device recovery is '$(zstat | jget recovery)', want reissue"
LOG=/run/zblk/$ZID.log
kills=0 live_ms="" first_ms="" PEAK=0 n=0
while [ $kills -lt "$ZBLK_CRASH_KILLS" ] && kill -0 $U 2>/dev/null; do
    n=$((n + 1))
    sleep "$(awk -v s="$ZBLK_CRASH_SEED" -v n=$n -v g="$ZBLK_CRASH_GAP_S" 'BEGIN { srand(s + n); printf "%.1f", g + rand() * 1.4 }')"
    st=$(zstat | jnum stored_pages); [ "$st" -gt "$PEAK" ] && PEAK=$st
    pid=$(zdaemon_pid "$ZID") || continue
    taken=$(takeovers "$LOG")
    served=$(grep -c 'first request served at uptime' "$LOG")
    t=$(now)
    kill -9 "$pid" || continue
    kills=$((kills + 1))
    # The keeper says when the new daemon serves; its first request follows.
    wait_takeover "$LOG" "$taken" 300 || fail "kill $kills: no new daemon within 30 s: $(tail -3 "$LOG" | tr '\n' '|')"
    grep -q 'giving up' "$LOG" && fail "kill $kills: the keeper gave up: $(grep 'giving up' "$LOG")"
    ms=$(last_takeover_ms "$LOG")
    live_ms="$live_ms $ms"
    i=0
    while [ "$(grep -c 'first request served at uptime' "$LOG")" -le "$served" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    up=$(grep 'first request served at uptime' "$LOG" | tail -1 | sed 's/.*at uptime \([0-9.]*\).*/\1/')
    [ -n "$up" ] && [ $i -lt 100 ] && first_ms="$first_ms $(awk -v a="$t" -v b="$up" 'BEGIN { printf "%d", (b - a) * 1000 }')"
    log "kill $kills of pid $pid with $st pages stored: new daemon live in ${ms} ms"
done
[ $kills -ge 5 ] || fail "only $kills kills before the workload ended (want >= 5): raise zblk.usemem_mb"
handover_finish "$kills" kills
stats() { echo "$1" | tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { if (NR) printf "median=%d max=%d n=%d", v[int((NR + 1) / 2)], v[NR], NR; else printf "n=0" }'; }
pass "kills=$kills recoveries=$REC usemem_ok bad_pages=0 total_mb=$(echo "$UJ" | jget total_mb) peak_stored_pages=$PEAK mem=$BASE->$MEM kill_to_live_ms: $(stats "$live_ms") kill_to_first_request_ms: $(stats "$first_ms")"
