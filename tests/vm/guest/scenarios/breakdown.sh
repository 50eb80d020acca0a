# breakdown: where a swapped page's time goes, zblk against
# kernel zram in the same boot. One usemem process writes ZBLK_BD_MB of
# pages in a cgroup whose memory.high is ZBLK_LIMIT_MB (so most of them go
# out to swap), then verifies every one (so they come back in). The
# counters below are read at the start, when usemem marks its write phase
# done (--mark) and at the end; each phase's deltas are divided by its
# pages: swap-out by pswpout, swap-in by pswpin.
#   wall      elapsed time per page
#   busy/idle CPU time of the whole guest (both vCPUs, /proc/stat), idle
#             including iowait; irq is hard and soft interrupts
#   wl        the workload's cgroup (cpu.stat): user, and system, where
#             zram compresses (reclaim runs in the faulting task) and
#             zblk's pages are handed to the block layer
#   dmn       zblk's daemon (every thread, /proc/PID/task/*/stat), and
#             by thread: queue user (the engine plus libublk's loop) and
#             queue system (the ublk driver's work in the daemon: copies
#             between request pages and the daemon's buffers, io_uring;
#             page faults of fresh memory), free (the deferred-free drain
#             giving dead zspages back), reserve (the provisioner), rest
#   kswapd    background reclaim
#   other     busy less all of the above (kworkers, the stat calls)
#   eng       zblk's phase timers (`zblk add --phase-timers`): whole write
#             or read requests per page and their codec / allocation /
#             copy / slot-install (writes) or decode (reads) parts, and
#             the pages per request the device saw
# Phase timers are wall time of the queue thread (time it was preempted
# included); the CPU figures are ticks (10 ms) and cgroup usec.
# Each configuration of ZBLK_BD_CONFIGS runs in turn:
#   zram:ALGO[:LEVEL]         kernel zram (LEVEL through algorithm_params;
#                             zram's zstd is level 3 unless given one)
#   ramdisk:none              libublk's ramdisk example (carried into the
#                             guest: tools/scripts/build-ublk-ramdisk.sh),
#                             the transport's floor for zblk:none
#   zblk:ALGO[:MODE[:off]]    zblk with phase timers (":off" without: the
#                             timers' own cost, by comparing walls)
#   zblk:...+FLAG=VALUE       the same, made with zblk add --FLAG VALUE
#                             (repeatable: +queue-cpus=other+queues=1)
#   zblk:...@NAME=VALUE       the same, its daemon started with the
#                             environment variable NAME=VALUE (an A/B of
#                             an engine setting read from the environment)
#   pc=N                      sets vm.page-cluster to N for the
#                             configurations after it in the round (swap
#                             readahead: 2^N pages per swap-in request)
#   scatter=on|off            usemem verifies in a scattered order
#                             (`usemem --scatter`: random swap-ins, where
#                             readahead fetches pages nobody asked for)
#                             for the configurations after it in the round
#   thp=KB:MODE               writes MODE (never, advise, always,
#                             within_size, inherit) to the shmem_enabled
#                             of folio size KB kB (hugepages-KBkB; a missing
#                             file fails the scenario) for the
#                             configurations after it in the round (zblk's
#                             store is shmem: "always" gives it large
#                             folios; "advise" only a build that asks,
#                             MADV_HUGEPAGE, which zblk does not: a build
#                             that asked gained nothing, see BENCHMARKS.md)
#   procs=N                   usemem runs N worker processes of
#                             zblk.bd_mb / N MB each (a workload per CPU:
#                             no idle core) for the configurations after
#                             it in the round
#   randio=S                  after each configuration's swap workload,
#                             S seconds of random 4 KB O_DIRECT reads at
#                             queue depth 1 (randio --jobs 1) on a raw
#                             128 MB device of the same configuration,
#                             64 MB of it pre-filled: one line of phase
#                             qd1read (p50 and IOPS), for the zram and
#                             zblk configurations after it in the round
#                             (0: off); the zblk device has no phase
#                             timers, whose clock reads would be timed
#   hogs=N                    runs N busy loops (outside the workload's
#                             cgroup, nice 0) during the configurations
#                             after it in the round: swap under CPU
#                             contention, where zram compresses in the
#                             faulting task and zblk's queue threads must
#                             be scheduled (their time shows in other_us)
# The write phase ends when usemem's mark is seen (polled every 50 ms),
# so up to about 0.3 s of swap-in can land in the swap-out figures.
# zram frees a swap slot when its page comes back in (a synchronous swap
# device skips the swap cache), so evicting that page again writes it
# again: zram's swap-in phase includes about one swap-out per swap-in
# (other_dir_pages), zblk's far fewer (its swapped-in pages stay in the
# swap cache and are dropped clean).
# Every figure is one line `BREAKDOWN {json}`; the result line has the
# per-page walls. Knobs: zblk.bd_configs (commas), zblk.bd_rounds (1),
# zblk.bd_mb (384), zblk.limit_mb (128).
# Opt-in, by name (about 20-40 s of TCG time per configuration):
#   bash tests/vm/run.sh --kernel 7.3 --scenario breakdown
SCEN=breakdown
: "${ZBLK_BD_CONFIGS:=zram:lz4 zblk:none zblk:lz4 zblk:lz4:per-page:off zram:zstd zblk:zstd zblk:zstd:packed}"
: "${ZBLK_BD_ROUNDS:=1}" "${ZBLK_BD_MB:=384}"
ZBLK_BD_CONFIGS=$(echo "$ZBLK_BD_CONFIGS" | tr ',' ' ')
MARK=/tmp/zblk-bd.mark
CORPUS=/lib/zblk-vm/data/realmem-dev.bin.zst
pattern=synthetic corpus_args=""
if [ -f "$CORPUS" ]; then pattern=corpus corpus_args="--corpus $CORPUS"; fi
KSWAPD=$(grep -l '^kswapd0$' /proc/[0-9]*/comm 2>/dev/null | head -1 | cut -d/ -f3)
log "usemem 1 x $ZBLK_BD_MB MB ($pattern pages), memory.high $ZBLK_LIMIT_MB MB, kswapd0 pid ${KSWAPD:-none}"

# utime and stime (clock ticks) of process or thread /proc/$1 ("0 0" if gone).
ticks() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '{ print $12, $13 }' | grep . || echo "0 0"; }

# utime and stime of the daemon's threads by job: the queue threads (and
# the main thread, named zblk too, idle while serving), zblk-free (the
# deferred-free drain: it gives dead zspages back), zblk-reserve (the
# memory reserve's provisioner) and the rest (log, policy, io_uring
# workers): 8 numbers.
dmn_ticks() {
    for t in /proc/"$DPID"/task/*; do
        echo "$(cat "$t/comm" 2>/dev/null) $(sed 's/.*) //' "$t/stat" 2>/dev/null | awk '{ print $12, $13 }')"
    done | awk '
        NF == 3 { j = ($1 == "zblk" || $1 == "ramdisk") ? 1 : ($1 == "zblk-free") ? 2 : ($1 == "zblk-reserve") ? 3 : 4; u[j] += $2; s[j] += $3 }
        END { for (j = 1; j <= 4; j++) printf "%d %d ", u[j], s[j]; print "" }'
}

# One line of counters, in the order bd_phase reads them: uptime (1);
# guest user, system, idle+iowait, irq+softirq ticks (2-5); pswpout,
# pswpin (6-7); the cgroup's user and system usec (8-9); the daemon's
# utime, stime of queue, free, reserve and other threads (10-17);
# kswapd's stime (18); the engine's phase nanoseconds (19-25), pages
# written and read (26-27), write and read requests (28-29).
sample() {
    # Time and the kernel's counters first, together; the stat call below
    # may wait up to 200 ms for the free drain.
    t=$(now) io="$(vmstat pswpout) $(vmstat pswpin)"
    c=$(awk '/^cpu / { print $2 + $3, $4, $5 + $6, $7 + $8 }' /proc/stat)
    g=$(awk '$1 == "user_usec" { u = $2 } $1 == "system_usec" { s = $2 } END { print u + 0, s + 0 }' "$CG/cpu.stat")
    d="0 0 0 0 0 0 0 0" e="0 0 0 0 0 0 0 0 0 0 0"
    # A daemon's threads for zblk and the ramdisk; the engine's figures for zblk.
    [ "$KIND" = zram ] || d=$(dmn_ticks)
    if [ "$KIND" = zblk ]; then
        st=$(zstat | tr -d '\n')
        e=""
        for k in write_ns compress_ns alloc_ns copy_ns install_ns read_ns decode_ns pages_written pages_read num_writes num_reads; do
            e="$e $(echo "$st" | jnum $k)"
        done
    fi
    k=0
    [ -n "$KSWAPD" ] && k=$(ticks "$KSWAPD" | cut -d' ' -f2)
    echo "$t $c $io $g $d $k $e"
}

# Prints the BREAKDOWN json of phase $1 (out or in) from samples $2 to $3.
bd_phase() {
    echo "$2
$3" | awk -v phase="$1" -v cfg="$CFG" -v r="$R" -v hz=100 -v pc="$(cat /proc/sys/vm/page-cluster)" -v hogs="$NHOGS" -v scatter="${SCATTER:+1}" -v procs="$PROCS" '
        NR == 1 { for (i = 1; i <= NF; i++) a[i] = $i; next }
        { for (i = 1; i <= NF; i++) d[i] = $i - a[i] }
        END {
            pages = (phase == "out") ? d[6] : d[7]
            epages = (phase == "out") ? d[26] : d[27]
            if (pages <= 0) pages = 1
            t = 1e6 / hz / pages
            busy = (d[2] + d[3] + d[5]) * t
            du = d[10] + d[12] + d[14] + d[16]; ds = d[11] + d[13] + d[15] + d[17]
            printf "BREAKDOWN {\"round\":%d,\"config\":\"%s\",\"phase\":\"%s\",\"page_cluster\":%d,\"hogs\":%d,\"scatter\":%d,\"procs\":%d,\"pages\":%d,\"other_dir_pages\":%d,", r, cfg, phase, pc, hogs, scatter, procs, pages, (phase == "out") ? d[7] : d[6]
            printf "\"wall_us\":%.1f,\"busy_us\":%.1f,\"idle_us\":%.1f,\"irq_us\":%.1f,", d[1] * 1e6 / pages, busy, d[4] * t, d[5] * t
            printf "\"wl_user_us\":%.1f,\"wl_sys_us\":%.1f,\"dmn_user_us\":%.1f,\"dmn_sys_us\":%.1f,", d[8] / pages, d[9] / pages, du * t, ds * t
            printf "\"queue_user_us\":%.1f,\"queue_sys_us\":%.1f,\"free_us\":%.1f,\"reserve_us\":%.1f,\"dmn_rest_us\":%.1f,", d[10] * t, d[11] * t, (d[12] + d[13]) * t, (d[14] + d[15]) * t, (d[16] + d[17]) * t
            printf "\"kswapd_us\":%.1f,\"other_us\":%.1f", d[18] * t, busy - d[8] / pages - d[9] / pages - (du + ds + d[18] + d[5]) * t
            # Engine figures only where the phase timers ran.
            if (epages > 0 && d[19] + d[24] > 0) {
                if (phase == "out")
                    printf ",\"eng_us\":%.2f,\"compress_us\":%.2f,\"alloc_us\":%.2f,\"copy_us\":%.2f,\"install_us\":%.2f", d[19] / epages / 1e3, d[20] / epages / 1e3, d[21] / epages / 1e3, d[22] / epages / 1e3, d[23] / epages / 1e3
                else
                    printf ",\"eng_us\":%.2f,\"decode_us\":%.2f", d[24] / epages / 1e3, d[25] / epages / 1e3
                reqs = (phase == "out") ? d[28] : d[29]
                printf ",\"eng_pages\":%d,\"pages_per_request\":%.2f", epages, (reqs > 0) ? epages / reqs : 0
            }
            print "}"
        }'
}

# Brings up configuration $1; sets KIND and, for zblk, DPID.
bd_up() {
    cfg_parse "$1"
    KIND=$CFG_KIND env=$CFG_ENV algo=$CFG_ALGO mode=$CFG_MODE timers=--phase-timers
    [ "$KIND" = zblk ] || [ -z "$CFG_FLAGS" ] || fail "$1: +FLAG=VALUE is for zblk configurations"
    case $mode in *:off) mode=${mode%:off} timers="" ;; esac
    case $KIND in
    zram)
        [ -z "$env" ] || fail "$1: @NAME=VALUE is for zblk configurations"
        zram_swap_with "$algo" "$ZBLK_DEV_MB" ;;
    zblk)
        # shellcheck disable=SC2086 # timers and CFG_FLAGS are words or none
        zadd_env "$env" --size "${ZBLK_DEV_MB}M" --algo "$algo" --mode "$mode" $timers $CFG_FLAGS --swap
        DPID=$(zdaemon_pid "$ZID") || fail "$1: no daemon holds /dev/ublkc$ZID" ;;
    ramdisk)
        [ -z "$env" ] || fail "$1: @NAME=VALUE is for zblk configurations"
        rd_up ;;
    *) fail "unknown configuration '$1'" ;;
    esac
}

# libublk's ramdisk example (tools/scripts/build-ublk-ramdisk.sh) as swap:
# the transport's floor, one queue copying each request to and from RAM
# it zeroed at start (so only as large as the workload needs: its RAM is
# held from the start). Sets DPID.
RD_ID=9
rd_up() {
    command -v ramdisk >/dev/null ||
        fail "ramdisk: not in the guest (tests/vm/run.sh --carry \"\$(tools/scripts/build-ublk-ramdisk.sh)\")"
    ramdisk add "$RD_ID" $((ZBLK_BD_MB + 128)) >/tmp/zblk-rd.out 2>&1 ||
        fail "ramdisk add failed: $(tail -c 300 /tmp/zblk-rd.out | tr '\n' ' ')"
    i=0
    while [ ! -b "/dev/ublkb$RD_ID" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    [ -b "/dev/ublkb$RD_ID" ] || fail "ramdisk: no /dev/ublkb$RD_ID"
    # The example fails a flush with EINVAL, and mkswap ends with one: the
    # swap header is made in a file and copied without one.
    truncate -s $(((ZBLK_BD_MB + 128) << 20)) /tmp/zblk-rd.swap
    mkswap /tmp/zblk-rd.swap >/dev/null &&
        dd if=/tmp/zblk-rd.swap of="/dev/ublkb$RD_ID" bs=4096 count=1 oflag=direct 2>/dev/null &&
        swapon "/dev/ublkb$RD_ID" || fail "ramdisk: swapon failed"
    rm -f /tmp/zblk-rd.swap
    DPID=$(zdaemon_pid "$RD_ID") || fail "ramdisk: no daemon holds /dev/ublkc$RD_ID"
}

bd_down() {
    if [ "$KIND" = zram ]; then
        swapoff /dev/zram0 || fail "swapoff /dev/zram0 failed"
        echo 1 >/sys/block/zram0/reset
    elif [ "$KIND" = ramdisk ]; then
        swapoff "/dev/ublkb$RD_ID" || fail "swapoff /dev/ublkb$RD_ID failed"
        ramdisk del "$RD_ID" >/dev/null 2>&1 || fail "ramdisk del $RD_ID failed"
    else
        # Where the daemon's CPU time went, by thread name.
        log "$CFG daemon threads (utime stime ticks): $(for t in /proc/"$DPID"/task/*; do echo "$(cat "$t/comm"):$(ticks "${t#/proc/}" | tr ' ' '+')"; done | tr '\n' ' ')"
        must zblk del -n "$ZID" --force >/dev/null
    fi
}

# With randio=S: random reads at queue depth 1 on a raw device of
# configuration $CFG (after bd_up and bd_down), one BREAKDOWN line.
bd_randio() {
    [ "$RANDIO_S" -gt 0 ] || return 0
    case $KIND in
    zram)
        zram_make "$algo" 128
        rdev=/dev/zram0 ;;
    zblk)
        # shellcheck disable=SC2086 # CFG_FLAGS is words or none
        zadd_env "$env" --size 128M --algo "$algo" --mode "$mode" $CFG_FLAGS
        rdev=$ZDEV ;;
    *) return 0 ;;
    esac
    randio --dev "$rdev" --mb 64 --prefill --write-pct 0 --jobs 1 --seconds "$RANDIO_S" >/tmp/zblk-bd.randio 2>&1 ||
        fail "$CFG: randio reads failed: $(tail -c 300 /tmp/zblk-bd.randio)"
    rj=$(grep '"program":"randio"' /tmp/zblk-bd.randio | tail -1)
    p50=$(echo "$rj" | jget p50_us) iops=$(echo "$rj" | jget iops)
    echo "BREAKDOWN {\"round\":$R,\"config\":\"$CFG\",\"phase\":\"qd1read\",\"p50_us\":${p50:-null},\"iops\":${iops:-null}}"
    if [ "$KIND" = zram ]; then echo 1 >/sys/block/zram0/reset; else must zblk del -n "$ZID" >/dev/null; fi
}

# Runs usemem on configuration $CFG and prints its two BREAKDOWN lines;
# sets BD_WALL (the workload's elapsed seconds).
bd_run() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
    CG=$(cg_make "bd" "$ZBLK_LIMIT_MB")
    rm -f "$MARK"
    s0=$(sample)
    # shellcheck disable=SC2086 # corpus_args is two words or none, SCATTER one or none
    in_cg usemem --mb $((ZBLK_BD_MB / PROCS)) --procs "$PROCS" --mark "$MARK" $corpus_args $SCATTER >/tmp/zblk-bd.out 2>&1 &
    upid=$!
    track $upid
    # Each worker marks its own end of writing.
    # (cat: no mark file yet is 0 marks.)
    while [ "$(cat "$MARK" 2>/dev/null | grep -c written)" -lt "$PROCS" ] && kill -0 $upid 2>/dev/null; do sleep 0.05; done
    s1=$(sample)
    wait $upid
    urc=$?
    s2=$(sample)
    uj=$(grep '"program":"usemem"' /tmp/zblk-bd.out | tail -1)
    [ "$urc" = 0 ] || fail "$CFG: usemem exit $urc: $(tail -c 400 /tmp/zblk-bd.out | tr '\n' ' ')"
    [ "$(echo "$uj" | jget ok)" = true ] || fail "$CFG: usemem not ok: $uj"
    [ "$(echo "$uj" | jnum bad_pages)" = 0 ] || fail "$CFG: usemem saw bad pages: $uj"
    BD_WALL=$(echo "$uj" | jget wall_s)
    bd_phase out "$s0" "$s1"
    bd_phase in "$s1" "$s2"
    rmdir "$CG" 2>/dev/null
}

# pc=N changes vm.page-cluster for the rest of a round: each round starts
# from, and the scenario leaves, the value the boot had.
PC0=$(cat /proc/sys/vm/page-cluster)
THPS=/sys/kernel/mm/transparent_hugepage
# The shmem_enabled settings the boot had, as "file=value" words.
THP0=$(for f in "$THPS"/hugepages-*/shmem_enabled; do
    [ -f "$f" ] && echo "$f=$(sed 's/.*\[\(.*\)\].*/\1/' "$f")"
done)
thp_restore() { for w in $THP0; do echo "${w#*=}" >"${w%=*}"; done; }
# Large shmem folios of each size allocated so far, "KB:count" words.
thp_allocs() {
    for f in "$THPS"/hugepages-*/stats/shmem_alloc; do
        [ -f "$f" ] && k=${f#"$THPS"/hugepages-} && echo "${k%%kB/*}:$(cat "$f")"
    done | tr '\n' ' '
}
HOGS="" NHOGS=0
# Stops the busy loops and starts $1 new ones.
hogs_set() {
    for p in $HOGS; do kill "$p" 2>/dev/null; done
    HOGS="" NHOGS=0
    while [ "$NHOGS" -lt "$1" ]; do
        (while :; do :; done) &
        HOGS="$HOGS $!" NHOGS=$((NHOGS + 1))
        track $!
    done
}
trap 'hogs_set 0; thp_restore; echo "$PC0" >/proc/sys/vm/page-cluster' EXIT
summary=""
R=1
while [ "$R" -le "$ZBLK_BD_ROUNDS" ]; do
    echo "$PC0" >/proc/sys/vm/page-cluster
    hogs_set 0
    thp_restore
    SCATTER="" PROCS=1 RANDIO_S=0
    for CFG in $ZBLK_BD_CONFIGS; do
        case $CFG in
        scatter=on | scatter=off)
            SCATTER="" order="in address order"
            if [ "$CFG" = scatter=on ]; then SCATTER=--scatter order="in a scattered order"; fi
            log "usemem verifies $order from here on"
            continue ;;
        thp=*:*)
            k=${CFG#thp=} && f=$THPS/hugepages-${k%%:*}kB/shmem_enabled
            echo "${k#*:}" >"$f" || fail "cannot write ${k#*:} to $f"
            log "$f: $(cat "$f") from here on"
            continue ;;
        hogs=*)
            hogs_set "${CFG#hogs=}"
            log "$NHOGS busy loops from here on"
            continue ;;
        procs=*)
            PROCS=${CFG#procs=}
            [ "$PROCS" -ge 1 ] 2>/dev/null || fail "procs=$PROCS: expected a count of at least 1"
            log "usemem runs $PROCS workers of $((ZBLK_BD_MB / PROCS)) MB from here on"
            continue ;;
        randio=*)
            RANDIO_S=${CFG#randio=}
            [ "$RANDIO_S" -ge 0 ] 2>/dev/null || fail "randio=$RANDIO_S: expected seconds"
            log "random reads at queue depth 1 for $RANDIO_S s after each configuration from here on"
            continue ;;
        pc=*)
            echo "${CFG#pc=}" >/proc/sys/vm/page-cluster || fail "page-cluster ${CFG#pc=} refused"
            log "vm.page-cluster $(cat /proc/sys/vm/page-cluster) from here on"
            continue ;;
        esac
        bd_up "$CFG"
        bd_run
        bd_down
        bd_randio
        log "round $R $CFG: usemem ${BD_WALL} s; large shmem folios allocated so far (kB:count): $(thp_allocs)"
        summary="$summary $CFG=${BD_WALL}s"
    done
    R=$((R + 1))
done
pass "rounds=$ZBLK_BD_ROUNDS $pattern pages, usemem wall:$summary"
