# stall: one process larger than RAM, swapping to zblk, run after run,
# under a watchdog that explains any stall.
# The shape a new user tries first: `zblk add --size 2xRAM --algo lz4
# --swap`, no memory cgroup, one process (usemem --procs 1) that writes
# ZBLK_STALL_FACTOR (default 1.5) times the guest's RAM of pages (the
# real-memory corpus when carried in with --data), holds them a second,
# then reads every page back and checks it. ZBLK_STALL_RUNS (default 4)
# zblk runs in this boot; ZBLK_STALL_ZRAM says what comes before each:
#   each   the same workload on a zram lz4 swap device of the same size,
#          then swapoff, zram reset, zblk add (the shape that stalled once)
#   none   nothing: no zram device in this boot
# Each workload runs under stallwatch (tools/src/bin/stallwatch.rs): when
# neither swap traffic nor the workload's page faults have moved for
# ZBLK_STALL_QUIET_S (default 60) seconds it captures SysRq t, w, m, l,
# /proc/meminfo, /proc/vmstat, the kernel stacks of the daemon's and
# keeper's threads, kswapd's and the workload's, and `zblk stat`, on the
# console, then kills the workload. A guest so stuck that even stallwatch
# (mlocked, SCHED_FIFO 2) cannot run is the host's to ask: run with
# ZBLK_VM_MONITOR=1 ZBLK_VM_SYSRQ_SILENCE=90 (stallwatch prints a line
# every 20 s, so 90 s of silence means the guest itself is stuck).
# zblk.stall_ab=NAME=VALUE starts the daemon of every even-numbered zblk
# run with that variable in its environment, for an A/B in one boot
# (ZBLK_RESERVE_NOIO=1: the provisioner left an I/O flusher); the result
# then gives each half's failed writes and median time.
# Per run it logs the time, failed writes (zblk's failed_writes, the
# kernel's "Write-error on swap-device" lines), OOM kills and the longest
# quiet time; the result fails on any stall, bad page or OOM kill.
#
# Opt-in, by name; about 3-4 minutes of TCG time per zram+zblk pair with a
# 2 GB guest:
#   ZBLK_VM_MONITOR=1 ZBLK_VM_SYSRQ_SILENCE=90 \
#   ZBLK_VM_ARGS='zblk.stall_runs=4 zblk.stall_zram=each zblk.timeout=3000' \
#     bash tests/vm/run.sh --kernel 6.12 --scenario stall --timeout 3300 \
#     --data ../shared/corpus/realmem-dev.bin.zst
SCEN=stall
: "${ZBLK_STALL_RUNS:=4}" "${ZBLK_STALL_ZRAM:=each}" "${ZBLK_STALL_FACTOR:=1.5}"
: "${ZBLK_STALL_QUIET_S:=60}" "${ZBLK_STALL_ALGO:=lz4}"
case $ZBLK_STALL_ZRAM in each | none) ;; *) fail "zblk.stall_zram must be each or none, not '$ZBLK_STALL_ZRAM'" ;; esac
CORPUS=/lib/zblk-vm/data/realmem-dev.bin.zst
pattern=synthetic corpus_args=""
if [ -f "$CORPUS" ]; then pattern=corpus corpus_args="--corpus $CORPUS"; fi
mem_kb=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)
work_mb=$(awk -v k="$mem_kb" -v f="$ZBLK_STALL_FACTOR" 'BEGIN { printf "%d", k * f / 1024 }')
dev_mb=$((mem_kb * 2 / 1024))
log "RAM $((mem_kb / 1024)) MB; one process of $work_mb MB ($pattern pages); devices $dev_mb MB; $ZBLK_STALL_RUNS zblk runs, zram before each: $ZBLK_STALL_ZRAM"
log "min_free_kbytes=$(cat /proc/sys/vm/min_free_kbytes) watermark_scale_factor=$(cat /proc/sys/vm/watermark_scale_factor) page-cluster=$(cat /proc/sys/vm/page-cluster) watermarks(all zones): $(awk '/^ +(min|low|high) / { w[$1] += $2 } END { printf "min=%d low=%d high=%d MB", w["min"] * 4 / 1024, w["low"] * 4 / 1024, w["high"] * 4 / 1024 }' /proc/zoneinfo)"

# The daemon's page faults (tracepoints exceptions:page_fault_user and
# page_fault_kernel, every daemon thread but the provisioner, whose job is
# faulting): a queue thread that faults in a fresh page when memory is
# short enters reclaim it cannot finish, so each zblk run reports how many
# faults each thread took and at which instructions (symbolize on the
# host: addr2line -f -C -e target/x86_64-unknown-linux-gnu/release/zblk
# IP-TEXT_BASE), and a stall's capture ends with the last of them.
TRACE=/sys/kernel/tracing
fault_trace_start() { # $1: the daemon's pid
    [ -d $TRACE/events ] || mount -t tracefs nodev $TRACE 2>/dev/null
    if [ ! -d $TRACE/events/exceptions/page_fault_user ]; then
        log "no exceptions:page_fault_user tracepoint: faults not traced"
        return
    fi
    echo 0 >$TRACE/tracing_on
    echo 256 >$TRACE/buffer_size_kb
    : >$TRACE/trace
    f=""
    for t in /proc/"$1"/task/*; do
        [ "$(cat "$t/comm")" = zblk-reserve ] && continue
        f="${f:+$f || }common_pid == ${t##*/}"
    done
    for e in page_fault_user page_fault_kernel; do
        echo "$f" >$TRACE/events/exceptions/$e/filter
        echo 1 >$TRACE/events/exceptions/$e/enable
    done
    echo 1 >$TRACE/tracing_on
    FAULT_TRACE="--tail $TRACE/trace"
    FAULT_PID=$1
    log "fault trace on"
}

# Where instruction `ip` (hex) is in process $2's mappings: FILE+OFFSET (the
# offset into the file: a vaddr for addr2line once the ELF's segment shift
# is added, e.g. +0x1000 for text in zblk's static-pie build).
where_ip() {
    local ip=$(($1)) lo hi range off path
    while read -r range _ off _ _ path; do
        lo=$((0x${range%-*})) hi=$((0x${range#*-}))
        if [ "$ip" -ge "$lo" ] && [ "$ip" -lt "$hi" ]; then
            printf '%s+0x%x' "${path:-anon}" $((ip - lo + 0x$off))
            return
        fi
    done <"/proc/$2/maps"
    printf 'unmapped'
}
fault_trace_report() {
    [ -n "${FAULT_TRACE:-}" ] || return 0
    echo 0 >$TRACE/tracing_on
    for e in page_fault_user page_fault_kernel; do echo 0 >$TRACE/events/exceptions/$e/enable; done
    summary=""
    while read -r n who event ip addr; do
        summary="$summary $n $who $event ip=$(where_ip "$ip" "$FAULT_PID") address=$(where_ip "$addr" "$FAULT_PID");"
    done <<TOP
$(grep -o '^ *[^ ]*-[0-9]* .*page_fault_[a-z]*: address=0x[0-9a-f]* ip=0x[0-9a-f]*' $TRACE/trace |
        awk '{ sub(/:$/, "", $5); split($0, a, "ip="); split(a[1], b, "address=")
               k = $1 " " $5 " " a[2]; n[k]++; at[k] = b[2] }
             END { for (k in n) print n[k], k, at[k] }' | sort -rn | head -12)
TOP
    log "daemon faults (count thread event ip=where address=where, one of them):$summary"
    FAULT_TRACE=""
}

# Runs the workload on the swap device just set up ($1: zram or zblk,
# for the log). Sets RUN_LINE (its figures) and RUN_STALL (1 when the
# watchdog found a stall).
stall_workload() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
    dmesg_mark
    oom0=$(vmstat oom_kill) out0=$(vmstat pswpout) in0=$(vmstat pswpin)
    t0=$(now)
    # shellcheck disable=SC2086 # corpus_args is two words or none
    usemem --mb "$work_mb" --procs 1 --sleep 1 $corpus_args >/tmp/zblk-vm.stall.out 2>&1 &
    upid=$!
    track $upid
    watch_args="--pid $upid --comm usemem --quiet $ZBLK_STALL_QUIET_S --console"
    if [ "$1" = zblk ]; then
        for p in $(zdaemon_pid "$ZID") $(zkeeper_pid "$ZID"); do watch_args="$watch_args --stack-pid $p"; done
        watch_args="$watch_args --zblk-id $ZID"
        fault_trace_start "$(zdaemon_pid "$ZID")"
        watch_args="$watch_args ${FAULT_TRACE:-}"
    fi
    # What memory and the device look like meanwhile, every 15 s.
    (while sleep 15; do log "$1 at $(elapsed "$t0") s: $(swap_sample "$1")"; done) &
    sampler=$!
    track $sampler
    # shellcheck disable=SC2086 # watch_args is words
    stallwatch $watch_args >/tmp/zblk-vm.stallwatch 2>&1
    wrc=$?
    kill $sampler 2>/dev/null
    [ "$1" = zblk ] && fault_trace_report
    wait $upid
    urc=$?
    wall=$(elapsed "$t0")
    RUN_STALL=0
    [ "$wrc" = 3 ] && RUN_STALL=1
    [ "$wrc" = 0 ] || [ "$wrc" = 3 ] || fail "stallwatch exit $wrc: $(tail -3 /tmp/zblk-vm.stallwatch | tr '\n' ' ')"
    longest=$(sed -n 's/.*longest quiet \([0-9]*\) s.*/\1/p' /tmp/zblk-vm.stallwatch)
    werr=$(dmesg_new | grep -c 'Write-error on swap-device')
    rerr=$(dmesg_new | grep -c 'Read-error on swap-device')
    ooms=$(( $(vmstat oom_kill) - oom0 ))
    uj=$(grep '"program":"usemem"' /tmp/zblk-vm.stall.out | tail -1)
    bad=$(echo "$uj" | jnum bad_pages)
    RUN_LINE="wall_s=$wall exit=$urc stall=$RUN_STALL longest_quiet_s=${longest:--} bad_pages=$bad oom_kills=$ooms write_errors=$werr read_errors=$rerr swapout_mb=$(( ($(vmstat pswpout) - out0) * PAGE / 1048576 )) swapin_mb=$(( ($(vmstat pswpin) - in0) * PAGE / 1048576 ))"
}

stalls="" problems="" walls_zram="" walls_zblk="" fw_total=0 werr_total=0
run=1
while [ "$run" -le "$ZBLK_STALL_RUNS" ]; do
    if [ "$ZBLK_STALL_ZRAM" = each ]; then
        zram_swap_with "$ZBLK_STALL_ALGO" "$dev_mb"
        stall_workload zram
        log "run $run zram: $RUN_LINE"
        [ "$RUN_STALL" = 1 ] && stalls="$stalls zram#$run"
        walls_zram="$walls_zram $wall"
        swapoff /dev/zram0 || fail "swapoff /dev/zram0 failed after run $run"
        echo 1 >/sys/block/zram0/reset
    fi
    ab="" half=a
    if [ -n "${ZBLK_STALL_AB:-}" ] && [ $((run % 2)) = 0 ]; then ab=$ZBLK_STALL_AB half=b; fi
    zadd_env "$ab" --size "${dev_mb}M" --algo "$ZBLK_STALL_ALGO" --swap
    stall_workload zblk
    fw=$(zstat | jnum failed_writes)
    log "run $run zblk${ab:+ $ab}: $RUN_LINE failed_writes=$fw reserve_refusals=$(zstat | jnum reserve_refusals) reserve_misses=$(zstat | jnum reserve_misses) daemon_ticks(queue,free,reserve,other)=$(daemon_ticks "$(zdaemon_pid "$ZID")" | tr ' ' ',')"
    fw_total=$((fw_total + fw)) werr_total=$((werr_total + werr))
    eval "fw_$half=\$((\${fw_$half:-0} + fw)) walls_$half=\"\${walls_$half:-} $wall\""
    walls_zblk="$walls_zblk $wall"
    if [ "$RUN_STALL" = 1 ]; then
        stalls="$stalls zblk#$run"
        # What the machine does once the workload is gone: recovered, or
        # stuck for good (then nothing after this can be trusted).
        timeout 300 zblk del -n "$ZID" --force >/dev/null 2>&1 ||
            fail "run $run stalled and zblk del did not finish within 300 s afterwards; stalls:$stalls"
    else
        must zblk del -n "$ZID" --force >/dev/null
    fi
    [ "$bad" = 0 ] || problems="$problems run$run:bad_pages=$bad"
    [ "$ooms" = 0 ] || problems="$problems run$run:oom_kills=$ooms"
    [ "$RUN_STALL" = 1 ] || [ "$urc" = 0 ] || problems="$problems run$run:usemem_exit=$urc"
    run=$((run + 1))
done
res="runs=$ZBLK_STALL_RUNS zram_before=$ZBLK_STALL_ZRAM pattern=$pattern work_mb=$work_mb ram_mb=$((mem_kb / 1024)) stalls=$(echo $stalls | wc -w) failed_writes=$fw_total write_errors=$werr_total zblk_wall_median=$(echo "$walls_zblk" | median)"
[ "$ZBLK_STALL_ZRAM" = each ] && res="$res zram_wall_median=$(echo "$walls_zram" | median)"
res="$res zblk_walls=$(echo $walls_zblk | tr ' ' ',')"
[ -n "${ZBLK_STALL_AB:-}" ] && res="$res | without $ZBLK_STALL_AB: failed_writes=${fw_a:-0} wall_median=$(echo "${walls_a:-}" | median) | with it: failed_writes=${fw_b:-0} wall_median=$(echo "${walls_b:-}" | median)"
[ -z "$stalls" ] || fail "$res stalled:$stalls$problems"
[ -z "$problems" ] || fail "$res problems:$problems"
pass "$res"
