# attrib-cost: does `zblk stat --by cgroup` slow the device it reads?
# The same swap load (usemem, ZBLK_USEMEM_PROCS x ZBLK_USEMEM_MB under
# memory.high ZBLK_LIMIT_MB, written then verified twice) runs on a
# fresh lz4 swap device ZBLK_ATTRIB_ROUNDS times (default 4), rounds
# alternating alone and with `zblk stat --by cgroup` in a loop (a pass,
# then a second's sleep; passes run back to back when one takes longer
# under TCG). Each round prints the device's per-page read and write
# latency (p50, p99 of the daemon's histograms over the round: the
# device is new) and the workload's time; the result line gives the
# medians of both kinds and their ratios. Pass: every page of every
# round verified, the scans found the workload's pages. The figures are
# reported, not judged (BENCHMARKS.md, "Who holds the swap").
# Opt-in:
#   bash tests/vm/run.sh --scenario attrib-cost
SCEN=attrib-cost
: "${ZBLK_ATTRIB_ROUNDS:=4}"
# Field $3 of operation $2's latency in stat's JSON $1.
lat_of() {
    echo "$1" | tr -d '\n ' | awk -v op="$2" -v f="$3" '{
        s = substr($0, index($0, "\"latency\":{"))
        s = substr(s, index(s, "\"" op "\":{"))
        s = substr(s, index(s, "\"" f "\":") + length(f) + 3)
        sub(/[,}].*/, "", s); print s }'
}
STOP=/tmp/zblk-vm.attrib-cost.stop
# Scans in a loop until $STOP exists; the number of passes, and the
# pages the last one found, go to /tmp/zblk-vm.scans.
scan_loop() {
    n=0 found=0
    while [ ! -f "$STOP" ]; do
        out=$(zblk stat --by cgroup --json 2>/dev/null) &&
            found=$(echo "$out" | tr -d '\n ' | grep -o '"distinct_pages":[0-9]*' | cut -d: -f2) &&
            n=$((n + 1))
        sleep 1
    done
    echo "$n ${found:-0}" >/tmp/zblk-vm.scans
}
r=1 alone="" scan="" scans_total=0
while [ "$r" -le "$ZBLK_ATTRIB_ROUNDS" ]; do
    mode=alone
    [ $((r % 2)) = 0 ] && mode=scan
    zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --swap
    CG=$(cg_make "$SCEN-$r" "$ZBLK_LIMIT_MB")
    rm -f "$STOP" /tmp/zblk-vm.scans
    if [ "$mode" = scan ]; then
        scan_loop &
        S=$!
        track $S
    fi
    t0=$(now)
    in_cg usemem --mb "$ZBLK_USEMEM_MB" --procs "$ZBLK_USEMEM_PROCS" --passes 2 >/tmp/zblk-vm.usemem 2>&1
    urc=$?
    secs=$(elapsed "$t0")
    touch "$STOP"
    [ "$mode" = scan ] && wait $S
    uj=$(grep '"program":"usemem"' /tmp/zblk-vm.usemem | tail -1)
    [ "$urc" = 0 ] && [ "$(echo "$uj" | jget ok)" = true ] && [ "$(echo "$uj" | jnum bad_pages)" = 0 ] ||
        fail "round $r ($mode): usemem exit $urc: $(tail -c 300 /tmp/zblk-vm.usemem | tr '\n' ' ')"
    j=$(zstat)
    rp50=$(lat_of "$j" read p50_us) rp99=$(lat_of "$j" read p99_us)
    wp50=$(lat_of "$j" write p50_us) wp99=$(lat_of "$j" write p99_us)
    extra=""
    if [ "$mode" = scan ]; then
        read -r scans found </tmp/zblk-vm.scans
        [ "$scans" -gt 0 ] && [ "$found" -gt 0 ] || fail "round $r: $scans scans found $found pages"
        extra=" scans=$scans last_found=$found"
        scans_total=$((scans_total + scans))
    fi
    log "round $r $mode: usemem ${secs}s read p50/p99 ${rp50}/${rp99} us write p50/p99 ${wp50}/${wp99} us$extra"
    eval "$mode=\"\$$mode $secs:$rp50:$rp99:$wp50:$wp99\""
    rmdir "$CG" 2>/dev/null
    must zblk del -n "$ZID" --force >/dev/null
    r=$((r + 1))
done
# Median of field $2 (1 time, 2-5 latencies) of the rounds $1.
med() { for x in $1; do echo "$x" | cut -d: -f"$2"; done | tr '\n' ' ' | median; }
res=""
for f in 1:time_s 3:read_p99_us 2:read_p50_us 5:write_p99_us 4:write_p50_us; do
    a=$(med "$alone" "${f%%:*}") s=$(med "$scan" "${f%%:*}")
    res="$res ${f#*:}=$a/$s($(ratio "$s" "$a")x)"
done
pass "rounds=$ZBLK_ATTRIB_ROUNDS (alone/with scans, median)$res scans=$scans_total"
