# wholemachine: which compressed swap serves a machine short of RAM best.
# The whole guest, no memory cgroup, runs a workload of ZBLK_WM_FACTOR
# (default 1.5) times its RAM:
# every system's compressed memory competes for the same RAM as on a real
# machine, so a better ratio means less swapping. usemem writes the pages
# from the real-memory corpus when it was carried in (--data
# ../shared/corpus/realmem-dev.bin.zst; the synthetic pattern otherwise,
# said in the result), holds them a second and verifies every one.
# Each configuration of ZBLK_WM_CONFIGS runs in turn, in the same boot:
#   zram:ALGO[:LEVEL]    kernel zram, swap priority 100, discard (LEVEL
#                        through algorithm_params)
#   zblk:ALGO[:packed]   a zblk swap device (zblk:ALGO:private: per page,
#                        with --no-recovery, its store in private memory)
#   zswap:ALGO           zswap (max_pool_percent 90) over a brd ramdisk swap
# each of them sized at twice the RAM. Result: time to completion, MB
# swapped out, and OOM kills per configuration (a configuration whose
# workload the OOM killer ended gets "oom" instead of a time), every page
# verified where it finished, and the ratios zblk's targets are set in:
# zblk:zstd:packed against zram:lz4 and zram:zstd, zswap:lzo-rle against
# it. ZBLK_WM_ROUNDS (default 1) repeats the list; the ratios are medians.
# Knobs: zblk.wm_configs=zram:lz4,zblk:zstd:packed (commas), zblk.wm_factor,
# zblk.wm_wsf (vm.watermark_scale_factor), zblk.wm_rt=0 (the provisioner
# at normal priority, not SCHED_FIFO 1), zblk.wm_timers=1 (zblk's phase
# timers on, and an "engine" line per zblk configuration: see wm_engine),
# a zblk configuration ending in @NAME=VALUE has its daemon started with
# that environment variable (zblk:lz4@ZBLK_RESERVE_SCALE=4: an A/B), and
# one with +FLAG=VALUE is made with zblk add --FLAG VALUE
# (zblk:lz4+queue-cpus=other),
# zblk.wm_rounds, zblk.wm_procs.
#
# zblk serves this load through its memory reserve (docs/daemon.md,
# "Swapping when the machine is out of memory"); times are in
# BENCHMARKS.md, "The whole machine at 1.5x RAM". A configuration stuck
# past ZBLK_WM_LIMIT_S fails the scenario with where its processes wait.
#
# Opt-in, by name; it takes about 1-2 minutes of TCG time per
# configuration with a 2 GB guest, so give it time:
#   ZBLK_VM_ARGS='zblk.timeout=2400' bash tests/vm/run.sh --kernel 7.3 \
#     --scenario wholemachine --timeout 2700 --data ../shared/corpus/realmem-dev.bin.zst
SCEN=wholemachine
: "${ZBLK_WM_FACTOR:=1.5}"
: "${ZBLK_WM_CONFIGS:=zram:lz4 zram:zstd zblk:lz4 zblk:zstd zblk:zstd:packed zswap:lzo-rle zswap:lz4 zswap:zstd}"
: "${ZBLK_WM_ROUNDS:=1}"
: "${ZBLK_WM_PROCS:=2}"
# A configuration whose workload has not ended after this long is stuck:
# the scenario fails with what its processes are waiting on.
: "${ZBLK_WM_LIMIT_S:=600}"
# zblk.wm_configs on the kernel command line cannot hold spaces: commas.
ZBLK_WM_CONFIGS=$(echo "$ZBLK_WM_CONFIGS" | tr ',' ' ')
CORPUS=/lib/zblk-vm/data/realmem-dev.bin.zst
pattern=synthetic corpus_args=""
if [ -f "$CORPUS" ]; then pattern=corpus corpus_args="--corpus $CORPUS"; fi
ZSW=/sys/module/zswap/parameters
mem_kb=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)
total_mb=$(awk -v k="$mem_kb" -v f="$ZBLK_WM_FACTOR" 'BEGIN { printf "%d", k * f / 1024 }')
per_mb=$((total_mb / ZBLK_WM_PROCS))
dev_mb=$((mem_kb * 2 / 1024))
log "RAM $((mem_kb / 1024)) MB; workload $ZBLK_WM_PROCS x $per_mb MB ($pattern pages); devices $dev_mb MB"
# zblk.wm_wsf=N: vm.watermark_scale_factor for every configuration (the
# kernel's default is 10: kswapd wakes 0.1 % of RAM above the min
# watermark, below which only the kernel's own reclaim may allocate).
if [ -n "${ZBLK_WM_WSF:-}" ]; then
    echo "$ZBLK_WM_WSF" >/proc/sys/vm/watermark_scale_factor || fail "watermark_scale_factor $ZBLK_WM_WSF refused"
fi
log "vm.watermark_scale_factor=$(cat /proc/sys/vm/watermark_scale_factor) min_free_kbytes=$(cat /proc/sys/vm/min_free_kbytes) DMA32 $(awk '/zone +DMA32/ { z = 1 } z && /^ +(min|low|high) / { printf "%s=%d MB ", $1, $2 * 4 / 1024 } z && /^ +high / { exit }' /proc/zoneinfo)"

# Brings up the swap of configuration $1 (kind:algo[:mode]).
wm_up() {
    cfg_parse "$1"
    kind=$CFG_KIND env=$CFG_ENV algo=$CFG_ALGO mode=$CFG_MODE extra=$CFG_FLAGS
    # zblk:ALGO:private: per-page, the store in private memory
    # (--no-recovery) rather than the memfd.
    [ "$mode" = private ] && mode=per-page extra="$extra --no-recovery"
    case $kind in
    zram)
        [ -z "$env" ] || fail "$1: @NAME=VALUE is for zblk configurations"
        zram_swap_with "$algo" "$dev_mb" ;;
    zblk)
        # zblk.wm_rt=0: the reserve's provisioner at normal priority
        # (ZBLK_RESERVE_SCHED=normal, src/provision.rs) instead of the
        # default SCHED_FIFO 1, for an A/B.
        if [ "${ZBLK_WM_RT:-1}" = 0 ]; then
            export ZBLK_RESERVE_SCHED=normal
        else
            unset ZBLK_RESERVE_SCHED
        fi
        # zblk.wm_timers=1: the engine's phase timers, read by wm_engine.
        [ "${ZBLK_WM_TIMERS:-0}" = 1 ] && extra="$extra --phase-timers"
        # shellcheck disable=SC2086 # extra is words or none
        zadd_env "$env" --size "${dev_mb}M" --algo "$algo" --mode "$mode" $extra --swap
        # zblk.wm_wbt=USEC: the device's writeback throttling latency
        # (0: off; zram, a bio device, has none).
        if [ -n "${ZBLK_WM_WBT:-}" ]; then
            echo "$ZBLK_WM_WBT" >"/sys/block/${ZDEV#/dev/}/queue/wbt_lat_usec" || fail "wbt_lat_usec refused"
        fi
        log "${ZDEV#/dev/} wbt_lat_usec=$(cat "/sys/block/${ZDEV#/dev/}/queue/wbt_lat_usec" 2>/dev/null || echo none) provisioner_policy=$(reserve_policy)" ;;
    zswap)
        [ -z "$env" ] || fail "$1: @NAME=VALUE is for zblk configurations"
        [ -d "$ZSW" ] || fail "no zswap in this kernel ($ZSW missing)"
        rmmod brd 2>/dev/null
        insmod /lib/zblk-vm/modules/brd.ko rd_nr=1 rd_size=$((dev_mb * 1024)) ||
            fail "insmod brd failed (is brd in the kernel's module list?)"
        must mkswap /dev/ram0 >/dev/null
        must swapon --priority 100 /dev/ram0
        echo "$algo" >"$ZSW/compressor" || fail "zswap: compressor $algo refused"
        [ -w "$ZSW/zpool" ] && echo zsmalloc >"$ZSW/zpool"
        echo 90 >"$ZSW/max_pool_percent"
        echo 1 >"$ZSW/enabled" ;;
    *) fail "unknown configuration '$1'" ;;
    esac
}

# Takes the swap of configuration $1 down again.
wm_down() {
    case ${1%%:*} in
    zram)
        swapoff /dev/zram0 || fail "swapoff /dev/zram0 failed"
        echo 1 >/sys/block/zram0/reset ;;
    zblk)
        must zblk del -n "$ZID" --force >/dev/null ;;
    zswap)
        echo 0 >"$ZSW/enabled"
        swapoff /dev/ram0 || fail "swapoff /dev/ram0 failed"
        rmmod brd || fail "rmmod brd failed" ;;
    esac
}

# Logs a sample of configuration $1 every 20 s while usemem (pid $2,
# started at $3) runs; after ZBLK_WM_LIMIT_S fails the scenario with the
# threads of usemem's processes and of zblk's daemon and where they wait.
wm_watch() {
    i=0
    while kill -0 "$2" 2>/dev/null; do
        sleep 1
        i=$((i + 1))
        [ $((i % 20)) = 0 ] && log "$1 at ${i} s: $(swap_sample "$1")"
        if [ "$i" -ge "$ZBLK_WM_LIMIT_S" ]; then
            procs=$(grep -l '^usemem$' /proc/[0-9]*/comm 2>/dev/null | cut -d/ -f3)
            [ "${1%%:*}" = zblk ] && procs="$procs $(zdaemon_pid "$ZID")"
            for p in $procs; do
                log "stuck: pid $p: $(proc_stacks "$p" | tr '\n' '|')"
            done
            fail "$1: the workload has not ended after $ZBLK_WM_LIMIT_S s: $(swap_sample "$1")"
        fi
    done
}

# Runs the workload on configuration $1; sets WM_WALL ("oom" when the OOM
# killer ended it) and WM_FIGS.
wm_run() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
    out0=$(vmstat pswpout) oom0=$(vmstat oom_kill)
    t0=$(now)
    # shellcheck disable=SC2086 # corpus_args is two words or none
    usemem --mb "$per_mb" --procs "$ZBLK_WM_PROCS" --sleep 1 $corpus_args >/tmp/zblk-vm.wm 2>&1 &
    upid=$!
    track $upid
    wm_watch "$1" "$upid" "$t0"
    wait $upid
    urc=$?
    wall=$(elapsed "$t0")
    ooms=$(( $(vmstat oom_kill) - oom0 ))
    uj=$(grep '"program":"usemem"' /tmp/zblk-vm.wm | tail -1)
    bad=$(echo "$uj" | jnum bad_pages)
    [ "$bad" = 0 ] || fail "$1: usemem saw $bad bad pages: $uj"
    if [ "$urc" = 0 ]; then
        WM_WALL=$wall
    elif [ "$ooms" -gt 0 ]; then
        WM_WALL=oom
    else
        fail "$1: usemem exit $urc without an OOM kill: $(tail -c 300 /tmp/zblk-vm.wm | tr '\n' ' ')"
    fi
    WM_FIGS="$1: wall_s=$WM_WALL swapout_mb=$(( ($(vmstat pswpout) - out0) * PAGE / 1048576 )) oom_kills=$ooms"
}

# With zblk.wm_timers=1, one line of where zblk configuration $1's time
# went: per page written and read (the engine's phase timers: queue-thread
# wall time, waits for the memory reserve's provisioner inside alloc),
# pages per write request, the reserve's misses, fallbacks and refusals,
# and its daemon's CPU ticks by thread (queue u/s, free u/s, reserve u/s,
# other u/s).
wm_engine() {
    [ "${1%%:*}" = zblk ] && [ "${ZBLK_WM_TIMERS:-0}" = 1 ] || return 0
    st=$(zstat | tr -d '\n')
    v=""
    for k in write_ns compress_ns alloc_ns copy_ns install_ns read_ns decode_ns pages_written pages_read num_writes reserve_misses reserve_fallbacks reserve_refusals; do
        v="$v $(echo "$st" | jnum $k)"
    done
    d=$(daemon_ticks "$(zdaemon_pid "$ZID")")
    log "engine $1: $(echo "$v" | awk '{ w = ($8 > 0) ? $8 : 1; r = ($9 > 0) ? $9 : 1
        printf "pages_written=%d write_us=%.2f compress_us=%.2f alloc_us=%.2f copy_us=%.2f install_us=%.2f pages_read=%d read_us=%.2f decode_us=%.2f pages_per_write=%.2f reserve_misses=%d fallbacks=%d refusals=%d",
            $8, $1 / w / 1e3, $2 / w / 1e3, $3 / w / 1e3, $4 / w / 1e3, $5 / w / 1e3, $9, $6 / r / 1e3, $7 / r / 1e3, ($10 > 0) ? $8 / $10 : 0, $11, $12, $13 }') daemon_ticks=$d"
}

round=1 lines=""
while [ "$round" -le "$ZBLK_WM_ROUNDS" ]; do
    for c in $ZBLK_WM_CONFIGS; do
        wm_up "$c"
        wm_run "$c"
        wm_engine "$c"
        wm_down "$c"
        log "round $round $WM_FIGS"
        lines="$lines|$WM_FIGS"
        key=$(echo "$c" | tr -c 'A-Za-z0-9_\n' '_')
        eval "walls_$key=\"\${walls_$key:-} $WM_WALL\""
    done
    round=$((round + 1))
done

# Median wall of configuration $1, "oom" if any round ran out of memory.
med() {
    key=$(echo "$1" | tr -c 'A-Za-z0-9_\n' '_')
    eval "v=\${walls_$key:-}"
    case $v in *oom*) echo oom ;; '') echo - ;; *) echo "$v" | median ;; esac
}
# Ratio of two medians, or "-" when either is missing or "oom".
mratio() {
    a=$(med "$1") b=$(med "$2")
    case "$a$b" in *oom*|*-*) echo - ;; *) ratio "$a" "$b" ;; esac
}
res="rounds=$ZBLK_WM_ROUNDS pattern=$pattern workload_mb=$((per_mb * ZBLK_WM_PROCS)) ram_mb=$((mem_kb / 1024)) medians:"
for c in $ZBLK_WM_CONFIGS; do res="$res $c=$(med "$c")"; done
res="$res | packed_zstd/zram_lz4=$(mratio zblk:zstd:packed zram:lz4) packed_zstd/zram_zstd=$(mratio zblk:zstd:packed zram:zstd)"
res="$res zswap_lzo_rle/packed_zstd=$(mratio zswap:lzo-rle zblk:zstd:packed) | runs$lines"
pass "$res"
