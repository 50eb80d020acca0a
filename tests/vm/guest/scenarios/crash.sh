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
# Two kills are timed: the second lands during a `zblk compact` (started
# just before it) and the fourth during a munmap's discard flood (64 MB of
# munmap_bench paged out to the device, then unmapped: the kill follows
# the unmap's start, while the discards arrive); munmap_bench must then
# end cleanly. The others fall at random moments.
#
# In run.sh's default list (before swapkill; about 1-2 min under TCG); alone:
#   bash tests/vm/run.sh --scenario crash
SCEN=crash
: "${ZBLK_CRASH_KILLS:=6}" "${ZBLK_CRASH_SEED:=$(cut -d. -f2 /proc/uptime)}" "${ZBLK_CRASH_GAP_S:=2.6}"
handover_start 8
[ "$(zstat | jget recovery)" = reissue ] || fail "device recovery is '$(zstat | jget recovery)', want reissue"
LOG=/run/zblk/$ZID.log
MB_OUT=/tmp/zblk-vm.crash-mb MB_GO=/tmp/zblk-vm.crash-go MB_PID=""
# Sets up the moment of kill number $1 + 1; MOMENT says which it is (not
# run in a command substitution: MB_PID must reach this shell).
crash_moment() {
    case $1 in
    1)
        zblk compact -n "$ZID" >/tmp/zblk-vm.crash-compact 2>&1 &
        sleep 0.05
        MOMENT=compaction;;
    3)
        rm -f "$MB_GO"
        munmap_bench --mb 64 --wait-file "$MB_GO" >"$MB_OUT" 2>&1 &
        MB_PID=$!
        track $MB_PID
        local i=0
        while ! grep -q '"event":"paged_out"' "$MB_OUT" && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
        grep -q '"event":"paged_out"' "$MB_OUT" || fail "munmap_bench did not page out: $(tail -c 300 "$MB_OUT")"
        touch "$MB_GO"
        sleep 0.05
        MOMENT=munmap-flood;;
    *) MOMENT=random;;
    esac
}
# The flood's munmap_bench ended cleanly across the kill.
crash_moments_done() {
    # An error here means the kill cut the compaction short, as meant.
    log "the compaction at kill 2 said: $(head -1 /tmp/zblk-vm.crash-compact)"
    [ -n "$MB_PID" ] || fail "no kill fell during a munmap flood"
    wait "$MB_PID" || fail "munmap_bench failed across the kill: $(tail -c 300 "$MB_OUT")"
    grep -q '"program":"munmap_bench"' "$MB_OUT" || fail "munmap_bench gave no result: $(tail -c 300 "$MB_OUT")"
}
kills=0 live_ms="" first_ms="" PEAK=0 n=0
while [ $kills -lt "$ZBLK_CRASH_KILLS" ] && kill -0 $U 2>/dev/null; do
    n=$((n + 1))
    sleep "$(awk -v s="$ZBLK_CRASH_SEED" -v n=$n -v g="$ZBLK_CRASH_GAP_S" 'BEGIN { srand(s + n); printf "%.1f", g + rand() * 1.4 }')"
    st=$(zstat | jnum stored_pages); [ "$st" -gt "$PEAK" ] && PEAK=$st
    pid=$(zdaemon_pid "$ZID") || continue
    taken=$(takeovers "$LOG")
    served=$(grep -c 'first request served at uptime' "$LOG")
    crash_moment "$kills"
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
    log "kill $kills ($MOMENT) of pid $pid with $st pages stored: new daemon live in ${ms} ms"
done
crash_moments_done
[ $kills -ge 5 ] || fail "only $kills kills before the workload ended (want >= 5): raise zblk.usemem_mb"
handover_finish "$kills" kills
stats() { echo "$1" | tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { if (NR) printf "median=%d max=%d n=%d", v[int((NR + 1) / 2)], v[NR], NR; else printf "n=0" }'; }
pass "kills=$kills recoveries=$REC usemem_ok bad_pages=0 total_mb=$(echo "$UJ" | jget total_mb) peak_stored_pages=$PEAK mem=$BASE->$MEM kill_to_live_ms: $(stats "$live_ms") kill_to_first_request_ms: $(stats "$first_ms")"
