# soak: ZBLK_SOAK_S seconds (default 60) of mixed traffic on two devices
# with two queues each, every page verified:
#   - swap pressure: usemem rounds, several processes in a memory cgroup
#     (memory.high ZBLK_LIMIT_MB), two verify passes each, a new seed
#     per round, through the swap device;
#   - munmap floods: munmap_bench rounds (processes that page a region out
#     and unmap it at once) on the same swap device;
#   - direct I/O: randio rounds (random 4 KB reads and writes from two jobs,
#     each read checked against the generation last written) on a second,
#     non-swap device;
#   - every 10 s: `zblk compact` of both devices and a `zblk set --mem-limit`
#     change of the swap device (none, or twice what it uses + 128 MB:
#     limits that move under the traffic but leave room; exhaust tests
#     refusals).
# Pass: every round of every workload verified all its data; both queues
# of both devices served requests; the kernel saw no swap or I/O error,
# stat no failed request; the guest's watchdog never stalled; once the
# workloads have exited the swap device stores no more than the swap
# areas still hold (0 once the freed slots are discarded), and after
# swapoff and blkdiscard both devices store nothing and their memory is
# back at the baseline.
#
# The 10-minute soak is opt-in (too long for CI's default run):
#   ZBLK_VM_ARGS='zblk.soak_s=600 zblk.timeout=900' bash tests/vm/run.sh --scenario soak --timeout 1500
: "${ZBLK_SOAK_S:=60}" "${ZBLK_SOAK_PROCS:=3}" "${ZBLK_SOAK_MB:=64}" "${ZBLK_SOAK_MUNMAP_MB:=32}"
grep -q "(deleted)" /proc/swaps && fail "a dead swap area from an earlier scenario is active (run swapkill last)"
dmesg_mark
zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --swap --queues 2
SW=$ZID SWDEV=$ZDEV
zadd --size 64M --algo "$ZBLK_ALGO" --queues 2
IO=$ZID IODEV=$ZDEV
BASE_SW=$(zstat "$SW" | jnum mem_used_total) BASE_IO=$(zstat "$IO" | jnum mem_used_total)
STOP=/tmp/zblk-vm.soak.stop R=/tmp/zblk-vm.soak
rm -f "$STOP" "$R".*
CG=$(cg_make soak "$ZBLK_LIMIT_MB")

# Each loop runs rounds until $STOP exists and appends one line per round
# to $R.<name>: "ok FIGURES" or "bad WHY" (a loop runs in a subshell: it
# cannot end the scenario itself).
loop_usemem() {
    local n=0 rc uj
    while [ ! -e "$STOP" ]; do
        n=$((n + 1))
        in_cg usemem --mb "$ZBLK_SOAK_MB" --procs "$ZBLK_SOAK_PROCS" --sleep 1 --passes 2 --seed "$n" >"$R.out.usemem" 2>&1
        rc=$?
        uj=$(grep '"program":"usemem"' "$R.out.usemem" | tail -1)
        if [ "$rc" = 0 ] && [ "$(echo "$uj" | jget ok)" = true ] && [ "$(echo "$uj" | jnum bad_pages)" = 0 ]; then
            echo "ok $(echo "$uj" | jnum total_mb)" >>"$R.usemem"
        else
            echo "bad round $n exit $rc: $(tail -c 300 "$R.out.usemem" | tr '\n' ' ')" >>"$R.usemem"
        fi
    done
}
loop_munmap() {
    local n=0 rc
    while [ ! -e "$STOP" ]; do
        n=$((n + 1))
        munmap_bench --mb "$ZBLK_SOAK_MUNMAP_MB" --procs 2 --min-swap-pct 50 --seed "$n" >"$R.out.munmap" 2>&1
        rc=$?
        if [ "$rc" = 0 ] && grep -q '"program":"munmap_bench"' "$R.out.munmap"; then
            echo "ok $((2 * ZBLK_SOAK_MUNMAP_MB))" >>"$R.munmap"
        else
            echo "bad round $n exit $rc: $(tail -c 300 "$R.out.munmap" | tr '\n' ' ')" >>"$R.munmap"
        fi
    done
}
# The operation count of kind $1 in randio's result line $2.
ops() { echo "$2" | grep -o "\"$1\":{[^}]*}" | grep -o '"ops":[0-9]*' | cut -d: -f2; }
loop_randio() {
    local n=0 rc rj
    while [ ! -e "$STOP" ]; do
        n=$((n + 1))
        randio --dev "$IODEV" --mb 32 --write-pct 50 --seconds 8 --prefill --jobs 2 --seed "$n" >"$R.out.randio" 2>&1
        rc=$?
        rj=$(grep '"bad_pages"' "$R.out.randio" | tail -1)
        if [ "$rc" = 0 ] && [ "$(echo "$rj" | jget ok)" = true ]; then
            # Operations of each kind ("read":{...,"ops":N,...}): every
            # read was checked against the generation last written.
            echo "ok $(ops read "$rj") $(ops write "$rj")" >>"$R.randio"
        else
            echo "bad round $n exit $rc: $(tail -c 300 "$R.out.randio" | tr '\n' ' ')" >>"$R.randio"
        fi
    done
}

# The loops stop when the scenario ends, however it ends; their output goes
# to their files only (see watchdog_start).
trap 'touch "$STOP"' EXIT
watchdog_start
for w in usemem munmap randio; do
    : >"$R.$w"
    loop_$w </dev/null >/dev/null 2>&1 &
    track $!
    eval "PID_$w=$!"
done

# Maintenance under the traffic, every 10 s, until the time is up; the
# peak of stored pages for the memory check at the end.
t0=$(now) compacts=0 sets=0 PEAK=0 limits=""
while [ "$(awk -v a="$(elapsed "$t0")" -v b="$ZBLK_SOAK_S" 'BEGIN { print (a < b) }')" = 1 ]; do
    sleep 10
    for d in "$SW" "$IO"; do
        must zblk compact -n "$d" >/dev/null
        compacts=$((compacts + 1))
    done
    st=$(zstat "$SW" | jnum stored_pages)
    [ "$st" -gt "$PEAK" ] && PEAK=$st
    if [ $((sets % 2)) = 0 ]; then
        # Room for the growth of the next 10 s (the slab grows ahead of
        # the compressed bytes until a compaction gives pages back).
        lim=$(( ($(zstat "$SW" | jnum mem_used_total) >> 20) * 2 + 128 ))M
    else
        lim=0
    fi
    must zblk set -n "$SW" --mem-limit "$lim" >/dev/null
    [ "$lim" = 0 ] || [ "$(zstat_store mem_limit "$SW")" = $(( ${lim%M} * 1048576 )) ] ||
        fail "zblk set --mem-limit $lim: stat shows mem_limit $(zstat_store mem_limit "$SW")"
    sets=$((sets + 1)) limits="$limits $lim"
    for w in usemem munmap randio; do
        grep -q '^bad' "$R.$w" && fail "$w: $(grep '^bad' "$R.$w" | head -1)"
    done
done
must zblk set -n "$SW" --mem-limit 0 >/dev/null
touch "$STOP"
log "traffic for $(elapsed "$t0") s; waiting for the rounds under way"
wait $PID_usemem $PID_munmap $PID_randio
watchdog_check

for w in usemem munmap randio; do
    grep -q '^bad' "$R.$w" && fail "$w: $(grep '^bad' "$R.$w" | head -1)"
    [ "$(grep -c '^ok' "$R.$w")" -ge 1 ] || fail "$w: no round finished"
done
dmesg_new | grep -qiE 'segfault|SIGBUS|I/O error|-error on swap' &&
    fail "the kernel saw errors: $(dmesg_new | grep -iE 'segfault|SIGBUS|I/O error|-error on swap' | tail -2 | tr '\n' '|')"
for d in "$SW" "$IO"; do
    s=$(zstat "$d")
    for f in failed_reads failed_writes; do
        [ "$(echo "$s" | jnum $f)" = 0 ] || fail "device $d: $f $(echo "$s" | jnum $f)"
    done
    # Both queues served: each one wrote pages.
    q=$(queue_field pages_written "$d")
    [ "$(echo "$q" | wc -l)" = 2 ] || fail "device $d: stat shows $(echo "$q" | wc -l) queues, want 2"
    echo "$q" | grep -qx 0 && fail "device $d: a queue wrote no page (pages_written per queue: $(echo $q))"
done
QSW=$(echo $(queue_field pages_written "$SW") | tr ' ' '/') QIO=$(echo $(queue_field pages_written "$IO") | tr ' ' '/')

# The workloads are gone: the swap device stores what the swap areas hold
# (the kernel's swap cache) plus a little (swap_settled).
[ "$(zstat "$SW" | jnum stored_pages)" -gt "$PEAK" ] && PEAK=$(zstat "$SW" | jnum stored_pages)
swap_settled "$SW" "$PEAK"
left=$SWAP_LEFT
must swapoff "$SWDEV"
must blkdiscard -f "$SWDEV"
must blkdiscard "$IODEV"
wait_no_pages "$SW" 100
wait_no_pages "$IO" 100
wait_mem_back "$SW" "$BASE_SW" "$PEAK" 100
MEM_SW=$MEM
wait_mem_back "$IO" "$BASE_IO" 8192 100
rmdir "$CG" 2>/dev/null

sum() { awk -v c="$2" '$1 == "ok" { s += $c } END { print s + 0 }' "$1"; }
um=$(sum "$R.usemem" 2) mm=$(sum "$R.munmap" 2) rr=$(sum "$R.randio" 2) rw=$(sum "$R.randio" 3)
rounds="usemem=$(grep -c '^ok' "$R.usemem") munmap=$(grep -c '^ok' "$R.munmap") randio=$(grep -c '^ok' "$R.randio")"
# usemem writes its MB and reads them back twice; randio reads are checked.
verified_mb=$((um * 2 + rr * 4 / 1024))
pass "soak_s=$ZBLK_SOAK_S rounds: $rounds verified_mb=$verified_mb (usemem ${um} MB x 2 passes, randio $rr reads/$rw writes checked) munmap_mb=$mm compacts=$compacts mem_limit_sets=$sets ($(echo $limits)) pages_written per queue: swap $QSW io $QIO stored_after_exit=$left peak_stored_pages=$PEAK mem: swap $BASE_SW->$MEM_SW io $BASE_IO->$MEM watchdog_max_gap_s=$WATCHDOG_GAP"
