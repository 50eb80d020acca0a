# Helpers for the guest scenarios (busybox sh), sourced before each scenario
# and before --extra-script. The scenario's name is $1 (SCEN below).
#
# Knobs (kernel command line zblk.<knob>=VALUE, see /init), with defaults:
#   ZBLK_DEV_MB=1024       size of the swap device (zblk and zram alike)
#   ZBLK_LIMIT_MB=128      memory.high of the workload's cgroup
#   ZBLK_USEMEM_PROCS=2    usemem worker processes
#   ZBLK_USEMEM_MB=192     MB each usemem worker writes (total >= 3x the limit)
#   ZBLK_MUNMAP_SIZES="64 256"  regions (MB) of the munmap scenario ('+' separated on the command line)
#   ZBLK_MUNMAP_PROCS=1    processes that each map a region and unmap together
#   ZBLK_ALGO=lz4          compression algorithm of both devices
#   ZBLK_SETTLE_S=10       seconds allowed for stats to fall back after munmap

SCEN=${1:-extra}
: "${ZBLK_DEV_MB:=1024}" "${ZBLK_LIMIT_MB:=128}" "${ZBLK_USEMEM_PROCS:=2}" "${ZBLK_USEMEM_MB:=192}"
: "${ZBLK_MUNMAP_SIZES:=64 256}" "${ZBLK_MUNMAP_PROCS:=1}" "${ZBLK_ALGO:=lz4}" "${ZBLK_SETTLE_S:=10}"
ZBLK_MUNMAP_SIZES=$(echo "$ZBLK_MUNMAP_SIZES" | tr '+,' '  ')
PAGE=4096

# util-linux's tools when carried in /usr/sbin: busybox sh would otherwise
# run its own applets first, and those lack --priority and -z (and
# iproute2's ip: busybox's has no netns and no veth).
for t in swapon swapoff mkswap blkdiscard ip; do
    [ -x /usr/sbin/$t ] && eval "$t() { /usr/sbin/$t \"\$@\"; }"
done

log() { echo "[$SCEN] $*"; }
# Prints the result line and ends the scenario.
pass() { echo "PASS $SCEN $*"; exit 0; }
fail() { echo "FAIL $SCEN $*"; exit 1; }
# Runs a command, failing the scenario with its output when it fails.
must() {
    out=$("$@" 2>&1) || fail "'$*' failed: $(echo "$out" | tail -3 | tr '\n' ' ')"
    [ -n "$out" ] && echo "$out"
    return 0
}

# Remembers a background pid so that /init kills it if the scenario dies.
track() { echo "$1" >>/tmp/zblk-vm.pids; }

# First value of "KEY" in the JSON on stdin (numbers, strings, booleans).
# Top-level fields of zblk's JSON come before nested ones (queues), so the
# first match is the device-wide value.
jget() {
    tr -d '\n' | grep -o "\"$1\"[[:space:]]*:[[:space:]]*[^,}]*" | head -1 |
        sed 's/^[^:]*:[[:space:]]*//; s/"//g; s/[[:space:]]*$//'
}
# Like jget, but 0 when absent (for arithmetic).
jnum() { v=$(jget "$1"); echo "${v:-0}" | cut -d. -f1; }

# Integer ratio a/b with two decimals, "inf" when b is 0.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "inf"; else printf "%.2f", a / b }'; }

# The value of KEY ($2) in a line of figures KEY=VALUE ... ($1).
get() { echo "$1" | tr ' ' '\n' | grep "^$2=" | cut -d= -f2; }
# The median of the numbers on stdin (space or newline separated).
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }

# A /proc/vmstat counter.
vmstat() { awk -v k="$1" '$1 == k { print $2 }' /proc/vmstat; }

# Seconds since boot with centiseconds.
now() { cut -d' ' -f1 /proc/uptime; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# ---- zblk devices ---------------------------------------------------------

# zblk add "$@" --json; sets ZID (device id) and ZDEV (/dev/ublkbN) and
# checks that the block device really exists (a failed server would leave a
# plain file behind in devtmpfs on the first write otherwise).
zadd() {
    # Through a file, not a pipe: a daemon that kept the CLI's stdout open
    # would otherwise block the command substitution (and the console tee).
    zblk add "$@" --json </dev/null >/tmp/zblk-vm.add 2>&1 ||
        fail "zblk add $* failed: $(tail -3 /tmp/zblk-vm.add | tr '\n' ' ')"
    out=$(cat /tmp/zblk-vm.add)
    name=$(echo "$out" | grep -o 'ublkb[0-9][0-9]*' | head -1)
    [ -n "$name" ] || name=ublkb$(echo "$out" | jnum id)
    ZID=${name#ublkb}
    ZDEV=/dev/$name
    i=0
    while [ ! -b "$ZDEV" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    [ -b "$ZDEV" ] || fail "zblk add returned but $ZDEV is not a block device ($out)"
    log "added $ZDEV (id $ZID): $(echo "$out" | tr -d '\n' | cut -c1-200)"
}

# The JSON stats of device $1 (default $ZID).
zstat() { zblk stat -n "${1:-$ZID}" --json 2>/dev/null; }
# Field $1 of the store's statistics of device $2 (default $ZID), 0 when
# absent: the "stats" object, not the "device" one before it.
zstat_store() { zstat "${2:-$ZID}" | tr -d '\n' | awk '{ i = index($0, "\"stats\":{"); if (i) print substr($0, i + 9) }' | jnum "$1"; }
# Field $1 of the idle policy's report of device $2 (default $ZID).
zstat_policy() { zstat "${2:-$ZID}" | tr -d '\n' | awk '{ i = index($0, "\"policy\":{"); if (i) print substr($0, i + 10) }' | jget "$1"; }

# Field $1 of each queue of device $2 (default $ZID), one line per queue:
# the entries of the "queues" array, which follows the device-wide fields.
queue_field() {
    zstat "${2:-$ZID}" | tr -d '\n ' | sed 's/.*"queues":\[//' | grep -o "\"$1\":[0-9]*" | cut -d: -f2
}

# Pid of the process serving ublk device $1 (the one holding /dev/ublkcN open).
zdaemon_pid() {
    for p in /proc/[0-9]*; do
        ls -l "$p/fd" 2>/dev/null | grep -q "/dev/ublkc$1\$" && { echo "${p#/proc/}"; return 0; }
    done
    return 1
}

# Pid of the keeper of device $1: the process listening on its socket
# (/run/zblk/N.keeper.sock, found by inode in /proc/net/unix).
zkeeper_pid() {
    local ino p
    ino=$(awk -v s="/run/zblk/$1.keeper.sock" '$NF == s && $6 == "01" { print $7; exit }' /proc/net/unix)
    [ -n "$ino" ] || return 1
    for p in /proc/[0-9]*; do
        ls -l "$p/fd" 2>/dev/null | grep -q "socket:\[$ino\]" && { echo "${p#/proc/}"; return 0; }
    done
    return 1
}

# One line per thread of process $1: its name, state and where the kernel
# holds it (wchan, and the kernel stack's top frames where readable): what
# a hang report needs.
proc_stacks() {
    local t
    for t in /proc/"$1"/task/*; do
        [ -d "$t" ] || continue
        echo "${t##*/} $(cat "$t/comm" 2>/dev/null) $(awk '{ print $3 }' "$t/stat" 2>/dev/null) wchan=$(cat "$t/wchan" 2>/dev/null) $(head -4 "$t/stack" 2>/dev/null | awk '{ print $2 }' | tr '\n' ' ')"
    done
}

# The CPU ticks (user/system) of daemon $1's threads, summed by kind:
# "queue u/s free u/s reserve u/s other u/s" (queue threads, the deferred
# free's drain thread, the memory reserve's provisioner, the rest).
daemon_ticks() {
    for t in /proc/"$1"/task/*; do
        echo "$(cat "$t/comm" 2>/dev/null) $(sed 's/.*) //' "$t/stat" 2>/dev/null | awk '{ print $12, $13 }')"
    done | awk 'NF == 3 { j = ($1 == "zblk") ? 1 : ($1 == "zblk-free") ? 2 : ($1 == "zblk-reserve") ? 3 : 4; u[j] += $2; s[j] += $3 }
        END { for (j = 1; j <= 4; j++) printf "%d/%d ", u[j], s[j] }'
}

# zadd with NAME=VALUE ($1; nothing when empty) in the daemon's
# environment (an A/B of an engine setting read from the environment); the
# script gets its own value (or none) back after it.
zadd_env() {
    ze=$1 zn=${1%%=*} zsaved=__unset__
    shift
    if [ -n "$ze" ]; then
        case $zn in '' | [0-9]* | *[!A-Za-z0-9_]*) fail "bad variable name '$zn'" ;; esac
        eval "zsaved=\${$zn-__unset__}"
        export "${ze?}"
    fi
    zadd "$@"
    if [ -n "$ze" ]; then
        if [ "$zsaved" = __unset__ ]; then unset "$zn"; else export "$zn=$zsaved"; fi
    fi
}

# Splits a configuration of a scenario's list,
# KIND:ALGO[:MODE][+FLAG=VALUE...][@NAME=VALUE] ($1), into CFG_KIND,
# CFG_ALGO, CFG_MODE (all after ALGO's colon, further colons included;
# per-page when there is none), CFG_FLAGS (each +FLAG=VALUE as the words
# "--FLAG VALUE", for zblk add; empty when there is none) and CFG_ENV
# (NAME=VALUE, for zadd_env; empty when there is none). Kernel zram has no
# mode: zram:ALGO:LEVEL is CFG_ALGO ALGO:LEVEL (zram_swap sets the level).
cfg_parse() {
    CFG_KIND=${1%%:*} cfg_rest=${1#*:} CFG_ENV="" CFG_FLAGS=""
    case $cfg_rest in *@*=*) CFG_ENV=${cfg_rest#*@} cfg_rest=${cfg_rest%%@*} ;; esac
    case $cfg_rest in *+*=*)
        for f in $(echo "${cfg_rest#*+}" | tr '+' ' '); do
            CFG_FLAGS="$CFG_FLAGS --${f%%=*} ${f#*=}"
        done
        cfg_rest=${cfg_rest%%+*} ;;
    esac
    CFG_ALGO=${cfg_rest%%:*} CFG_MODE=per-page
    if [ "$CFG_KIND" = zram ]; then CFG_ALGO=$cfg_rest; return; fi
    if [ "$cfg_rest" != "$CFG_ALGO" ]; then CFG_MODE=${cfg_rest#*:}; fi
}

# Field $3 of the stat of each thread named $2 of process $1 (a pid, or
# '[0-9]*' for every process), one a line.
thread_field() {
    tf_n=$3
    for c in /proc/$1/task/[0-9]*/comm; do
        [ "$(cat "$c" 2>/dev/null)" = "$2" ] || continue
        st=$(cat "${c%/comm}/stat" 2>/dev/null) || continue
        # comm has no spaces here, so fields split plainly.
        # shellcheck disable=SC2086
        set -- $st
        shift $((tf_n - 1))
        echo "$1"
    done
}

# The PF_MEMALLOC_NOIO bit (0x80000: the thread's allocations are
# GFP_NOIO, as an I/O flusher's) of each thread of process $1 named $2, as
# the distinct values found ("0", "1", "0 1"), or "none".
thread_noio() {
    tn=$(thread_field "$1" "$2" 9 | while read -r f; do echo $(( (f >> 19) & 1 )); done | sort -u)
    echo ${tn:-none}
}

# The scheduling policy of the zblk-reserve threads (field 41 of their
# stat: 0 normal, 1 FIFO), comma-separated, or "none".
reserve_policy() {
    found=$(thread_field '[0-9]*' zblk-reserve 41 | tr '\n' ',')
    found=${found%,}
    echo "${found:-none}"
}

# Take-overs the keeper has logged in device log $1 (a line "... daemon pid
# P took over in T ms ..." each).
takeovers() { grep -c 'took over in' "$1"; }
# Waits up to $3 tenths of a second until log $1 counts more take-overs
# than $2; false on timeout.
wait_takeover() {
    local i=0
    while [ "$(takeovers "$1")" -le "$2" ]; do
        [ $i -ge "$3" ] && return 1
        sleep 0.1; i=$((i + 1))
    done
}
# T of the last take-over in log $1, in ms.
last_takeover_ms() { grep 'took over in' "$1" | tail -1 | sed 's/.*took over in \([0-9]*\) ms.*/\1/'; }

# True when $1 (a /dev path) is an active swap area.
is_swap() { grep -q "^$1 " /proc/swaps; }

# Waits up to $2 tenths of a second until device $1 stores no page; fails
# the scenario otherwise.
wait_no_pages() {
    local i=0 n
    while n=$(zstat "$1" | jnum stored_pages); [ "$n" != 0 ]; do
        [ $i -lt "$2" ] || fail "device $1 still stores $n pages after $(($2 / 10)) s"
        sleep 0.1; i=$((i + 1))
    done
}

# Waits up to $4 tenths of a second until device $1's mem_used_total is back
# at its baseline $2, at most 1 MB + 2% of $3 (its peak stored pages) above
# it: the allocator keeps some partly used slab pages. Fails the scenario
# otherwise; sets MEM.
wait_mem_back() {
    local i=0
    while :; do
        MEM=$(zstat "$1" | jnum mem_used_total)
        [ $((MEM - $2)) -le $((1048576 + $3 * 4096 / 50)) ] && break
        [ $i -lt "$4" ] || fail "memory of device $1 did not fall back: baseline $2, now $MEM (stored $(zstat "$1" | jnum stored_pages), peak $3 pages)"
        sleep 0.1; i=$((i + 1))
    done
}

# Waits up to 20 s until the swap device $1 (a zblk id) stores no more than
# the swap areas hold (/proc/swaps), plus at most 5 % of $2 (its peak stored
# pages), and what the swap areas hold is the kernel's swap cache
# (SwapCached, freed lazily once no process maps it) give or take 256
# pages: the workloads are gone, no process holds swapped pages, and the
# slack is slots freed in clusters still partly in use, which swap discards
# only once the whole cluster is free. Fails the scenario otherwise; sets
# SWAP_LEFT ("ST (swap used HELD, swap cache CACHED)").
swap_settled() {
    local i=0 held cached st
    while :; do
        held=$(awk 'NR > 1 { s += $4 } END { print int(s / 4) }' /proc/swaps)
        cached=$(awk '$1 == "SwapCached:" { print int($2 / 4) }' /proc/meminfo)
        st=$(zstat "$1" | jnum stored_pages)
        [ $((held - cached)) -le 256 ] && [ "$st" -le $((held + $2 / 20)) ] && break
        [ $i -lt 200 ] || fail "after the workloads exited: device $1 stores $st pages, the swap areas hold $held, of which $cached swap cache"
        sleep 0.1; i=$((i + 1))
    done
    SWAP_LEFT="$st (swap used $held, swap cache $cached)"
}

# Writes $2 MB (random, then compressible text) at the start of block device
# $1 with O_DIRECT, reads it back the same way and compares; fails the
# scenario on an I/O error or any difference.
dev_verify_rw() {
    local dev=$1 mb=$2 half
    half=$(( (mb + 1) / 2 ))
    dd if=/dev/urandom of=/tmp/zblk-vm.pat bs=1048576 count="$half" 2>/dev/null
    yes "zblk verified pattern $dev $(now)" | head -c $(( (mb - half) * 1048576 )) >>/tmp/zblk-vm.pat
    dd if=/tmp/zblk-vm.pat of="$dev" bs=1048576 oflag=direct conv=notrunc 2>/tmp/zblk-vm.dd ||
        fail "writing $mb MB to $dev failed: $(tail -1 /tmp/zblk-vm.dd)"
    dd if="$dev" of=/tmp/zblk-vm.rd bs=1048576 count="$mb" iflag=direct 2>/tmp/zblk-vm.dd ||
        fail "reading $mb MB of $dev failed: $(tail -1 /tmp/zblk-vm.dd)"
    cmp -s /tmp/zblk-vm.pat /tmp/zblk-vm.rd || fail "$dev: the $mb MB read back differ from those written"
    rm -f /tmp/zblk-vm.pat /tmp/zblk-vm.rd
}

# ---- backing devices ------------------------------------------------------------

# A backing device for writeback: a new sparse file $1 of size $2 attached
# to a free loop device, its name in BD (busybox's losetup has no --show: ask
# for the free one, then attach). Without losetup, BD is the file itself
# (buffered I/O on tmpfs, which refuses O_DIRECT: the daemon logs it).
loop_backing() {
    BD_FILE=$1
    truncate -s "$2" "$BD_FILE" || fail "cannot make $BD_FILE"
    if command -v losetup >/dev/null 2>&1; then
        BD=$(losetup -f) && losetup "$BD" "$BD_FILE" || fail "losetup of $BD_FILE failed"
    else
        BD=$BD_FILE
        log "no losetup: the backing device is $BD_FILE itself"
    fi
}
# Detaches and removes what loop_backing made.
loop_backing_release() { [ "$BD" = "$BD_FILE" ] || losetup -d "$BD" 2>/dev/null; rm -f "$BD_FILE"; }

# ---- kernel log and watchdog ----------------------------------------------------

# Marks where this scenario's kernel messages begin: dmesg_new prints those
# after the mark.
dmesg_mark() { DMESG_FROM=$(( $(dmesg | wc -l) + 1 )); }
dmesg_new() { dmesg | tail -n +"${DMESG_FROM:-1}" | tr -d '\000'; }

# "PID COMM" of every process the OOM killer killed since dmesg_mark.
oom_kills() {
    dmesg_new | grep -o 'Killed process [0-9]* ([^)]*)' | sed 's/^Killed process \([0-9]*\) (\(.*\))$/\1 \2/'
}

# Starts the guest's watchdog: a background loop, out of the OOM killer's
# reach, that appends the uptime to /tmp/zblk-vm.beats every half second.
# A guest that stalls (a reclaim livelock, a daemon stuck in the kernel)
# leaves a gap; a guest that hangs for good is the host's --timeout. Its
# output goes nowhere: a worker that outlives a failed scenario with the
# console pipe open would keep /init waiting on that pipe for good.
watchdog_start() {
    : >/tmp/zblk-vm.beats
    (
        echo -1000 >/proc/self/oom_score_adj
        while :; do now >>/tmp/zblk-vm.beats; sleep 0.5; done
    ) </dev/null >/dev/null 2>&1 &
    WATCHDOG=$!
    track $WATCHDOG
}

# Stops the watchdog; fails the scenario when it ever went more than $1
# seconds (default 20: TCG under memory pressure is slow) without a beat,
# up to now. Sets WATCHDOG_GAP (the longest gap, s) and WATCHDOG_BEATS.
watchdog_check() {
    local limit=${1:-20}
    kill "$WATCHDOG" 2>/dev/null
    WATCHDOG_BEATS=$(wc -l </tmp/zblk-vm.beats)
    [ "$WATCHDOG_BEATS" -ge 2 ] || fail "the watchdog beat only $WATCHDOG_BEATS times"
    WATCHDOG_GAP=$(awk -v t="$(now)" 'NR > 1 && $1 - p > m { m = $1 - p } { p = $1 } END { if (t - p > m) m = t - p; printf "%.1f", m }' /tmp/zblk-vm.beats)
    awk -v g="$WATCHDOG_GAP" -v l="$limit" 'BEGIN { exit !(g > l) }' &&
        fail "the guest stalled: no watchdog beat for ${WATCHDOG_GAP} s (limit $limit s, $WATCHDOG_BEATS beats)"
    return 0
}

# One line of how a swap configuration ($1: zram:..., zblk:... or zswap:...)
# is doing: free memory and swap, pages swapped out and in so far, and for
# zblk what device $ZID stores and how its memory reserve fares.
swap_sample() {
    m=$(awk '/^MemFree:/ { f = $2 } /^SwapFree:/ { s = $2 } END { printf "memfree_mb=%d swapfree_mb=%d", f / 1024, s / 1024 }' /proc/meminfo)
    d=""
    if [ "${1%%:*}" = zblk ]; then
        st=$(timeout 5 zblk stat -n "$ZID" --json 2>/dev/null | tr -d '\n')
        d=" stored_pages=$(echo "$st" | jnum stored_pages) mem_used_total=$(echo "$st" | jnum mem_used_total) failed_writes=$(echo "$st" | jnum failed_writes) mem_spare=$(echo "$st" | jnum mem_spare) reserve_misses=$(echo "$st" | jnum reserve_misses) reserve_refusals=$(echo "$st" | jnum reserve_refusals)"
    fi
    echo "$m pswpout=$(vmstat pswpout) pswpin=$(vmstat pswpin)$d"
}

# ---- kernel zram ------------------------------------------------------------

# Resets /dev/zram0 and sizes it $2 MB with algorithm $1: ALGO or
# ALGO:LEVEL, the level given through zram's algorithm_params (zram's zstd
# is level 3 unless told).
zram_make() {
    [ -e /sys/block/zram0 ] || fail "no /sys/block/zram0 (zram module not loaded?)"
    echo 1 >/sys/block/zram0/reset
    zs_name=${1%%:*}
    echo "$zs_name" >/sys/block/zram0/comp_algorithm || fail "zram: algorithm $zs_name refused"
    if [ "$zs_name" != "$1" ]; then
        [ -e /sys/block/zram0/algorithm_params ] || fail "zram: no algorithm_params for $1"
        echo "algo=$zs_name level=${1#*:}" >/sys/block/zram0/algorithm_params ||
            fail "zram: algorithm_params level=${1#*:} refused"
    fi
    echo "${2}M" >/sys/block/zram0/disksize || fail "zram: disksize refused"
}

# Sets up /dev/zram0 of $1 MB with $ZBLK_ALGO (as zram_make takes it) as
# swap with discard, priority 100.
zram_swap() {
    zram_make "$ZBLK_ALGO" "$1"
    must mkswap /dev/zram0 >/dev/null
    must swapon --discard --priority 100 /dev/zram0
    is_swap /dev/zram0 || fail "zram0 is not in /proc/swaps"
}

# zram_swap of $2 MB with algorithm $1 instead of ZBLK_ALGO (which keeps
# its value).
zram_swap_with() {
    zs_algo0=$ZBLK_ALGO
    ZBLK_ALGO=$1
    zram_swap "$2"
    ZBLK_ALGO=$zs_algo0
}

# zram's mm_stat: orig_data_size compr_data_size mem_used_total mem_limit
# mem_used_max same_pages pages_compacted huge_pages huge_pages_since. zram's
# orig_data_size counts every stored page (same-filled ones too), so
# orig_data_size / 4096 is its stored-pages figure.
zram_mm() { cat /sys/block/zram0/mm_stat; }
# Field $1 (1-based) of mm_stat.
zram_field() { awk -v f="$1" '{ print $f }' /sys/block/zram0/mm_stat; }
# notify_free of zram (4th field of io_stat).
zram_notify_free() { awk '{ print $4 }' /sys/block/zram0/io_stat; }

# ---- cgroup workloads --------------------------------------------------------

# Creates cgroup zblk-$1 with memory.high of $2 MB (swap unlimited) and,
# when $3 is given, memory.max of $3 MB (past it the OOM killer acts).
cg_make() {
    cg=/sys/fs/cgroup/zblk-$1
    mkdir -p "$cg" || fail "cannot create cgroup $cg"
    echo "${2}M" >"$cg/memory.high" || fail "cannot set memory.high"
    [ -z "${3:-}" ] || echo "${3}M" >"$cg/memory.max" || fail "cannot set memory.max"
    echo max >"$cg/memory.swap.max" 2>/dev/null
    echo "$cg"
}

# Runs "$@" inside cgroup directory $CG (exec keeps the pid).
in_cg() { sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CG" "$@"; }

# The hot/cold load of the writeback scenarios, in cgroup $CG: a cold
# usemem of ZBLK_USEMEM_MB that holds its pages until hold_end before
# verifying them, and a hot one of a quarter of that verifying them $1
# times (its pages keep swapping in and out). Sets COLD and HOT (pids);
# their output goes to /tmp/zblk-vm.cold and /tmp/zblk-vm.hot. Then
# waits for the hold: the cold one has written everything and stored
# pages of device $ZID stop growing (within 200); sets ST (stored pages
# then), returns 1 if they never pass 20000.
hot_cold_hold() {
    rm -f /tmp/zblk-vm.cold.mark /tmp/zblk-vm.cold.go
    in_cg usemem --mb "$ZBLK_USEMEM_MB" --mark /tmp/zblk-vm.cold.mark --hold-file /tmp/zblk-vm.cold.go >/tmp/zblk-vm.cold 2>&1 &
    COLD=$!
    track $COLD
    in_cg usemem --mb $(( ZBLK_USEMEM_MB / 4 )) --passes "$1" --seed 7 >/tmp/zblk-vm.hot 2>&1 &
    HOT=$!
    track $HOT
    local last=-1 i=0
    while [ $i -lt 600 ]; do
        sleep 0.5
        ST=$(zstat | jnum stored_pages)
        grep -q written /tmp/zblk-vm.cold.mark 2>/dev/null &&
            [ "$ST" -gt 20000 ] && [ "$ST" -le $(( last + 200 )) ] && [ "$ST" -ge $(( last - 200 )) ] && return 0
        last=$ST i=$((i + 1))
    done
    [ "$ST" -gt 20000 ]
}
# Ends hot_cold_hold's hold: the cold usemem goes on to verify its pages.
hold_end() { touch /tmp/zblk-vm.cold.go; }

# Samples device stats every second while pid $1 lives; keeps in
# /tmp/zblk-vm.peak the sample with the most stored pages ("$2" says how to
# sample: zblk or zram).
sample_peak() {
    best=-1
    while kill -0 "$1" 2>/dev/null; do
        if [ "$2" = zram ]; then
            s=$(zram_mm); n=$(echo "$s" | awk '{ print int($1 / 4096) }')
        else
            s=$(zstat); n=$(echo "$s" | jnum stored_pages)
        fi
        if [ -n "$n" ] && [ "$n" -gt "$best" ]; then
            best=$n
            echo "$s" >/tmp/zblk-vm.peak
        fi
        sleep 1
    done
}

# ---- device-neutral probes (KIND is zblk or zram) -----------------------------

# Stored pages, memory used and notify_free of the current device of KIND.
dev_stored() { if [ "$1" = zram ]; then echo $(( $(zram_field 1) / PAGE )); else zstat | jnum stored_pages; fi; }
dev_mem() { if [ "$1" = zram ]; then zram_field 3; else zstat | jnum mem_used_total; fi; }
dev_notify_free() { if [ "$1" = zram ]; then zram_notify_free; else zstat | jnum notify_free; fi; }
# orig_data_size and compr_data_size of a sample ($2) of KIND.
sample_orig() { if [ "$1" = zram ]; then echo "$2" | awk '{ print $1 }'; else echo "$2" | jnum orig_data_size; fi; }
sample_compr() { if [ "$1" = zram ]; then echo "$2" | awk '{ print $2 }'; else echo "$2" | jnum compr_data_size; fi; }
sample_memused() { if [ "$1" = zram ]; then echo "$2" | awk '{ print $3 }'; else echo "$2" | jnum mem_used_total; fi; }

# The pressure workload against the active swap device of KIND ($1): usemem
# in a cgroup whose memory.high is ZBLK_LIMIT_MB, writing USEMEM_PROCS x
# USEMEM_MB, so at least twice the limit has to go through swap. Every page
# is verified by usemem. Fails the scenario on any error; otherwise sets
# W_FIGS (figures for the result line) and W_* values, and saves the figures
# in /tmp/figures.swap.$1 for zram-compare.
swap_workload() {
    kind=$1
    CG=$(cg_make "swap-$kind" "$ZBLK_LIMIT_MB")
    out0=$(vmstat pswpout); in0=$(vmstat pswpin)
    rm -f /tmp/zblk-vm.peak
    t0=$(now)
    # USEMEM_FLAGS: more usemem flags (word-split), e.g. --thp.
    in_cg usemem --mb "$ZBLK_USEMEM_MB" --procs "$ZBLK_USEMEM_PROCS" --sleep 2 ${USEMEM_FLAGS:-} >/tmp/zblk-vm.usemem 2>&1 &
    upid=$!
    track $upid
    sample_peak $upid "$kind"
    wait $upid
    urc=$?
    W_WALL=$(elapsed "$t0")
    uj=$(grep '"program":"usemem"' /tmp/zblk-vm.usemem | tail -1)
    [ "$urc" = 0 ] || fail "$kind: usemem exit $urc: $(tail -c 400 /tmp/zblk-vm.usemem | tr '\n' ' ')"
    [ "$(echo "$uj" | jget ok)" = true ] || fail "$kind: usemem not ok: $uj"
    [ "$(echo "$uj" | jnum bad_pages)" = 0 ] || fail "$kind: usemem saw bad pages: $uj"
    W_OUT_MB=$(( ($(vmstat pswpout) - out0) * PAGE / 1048576 ))
    W_IN_MB=$(( ($(vmstat pswpin) - in0) * PAGE / 1048576 ))
    [ "$W_OUT_MB" -ge $((2 * ZBLK_LIMIT_MB)) ] ||
        fail "$kind: only ${W_OUT_MB} MB swapped out, want >= 2x the ${ZBLK_LIMIT_MB} MB limit"
    [ "$W_IN_MB" -gt 0 ] || fail "$kind: nothing swapped in (pswpin did not grow)"
    peak=$(cat /tmp/zblk-vm.peak 2>/dev/null)
    [ -n "$peak" ] || fail "$kind: no stats sample taken while the workload ran"
    if [ "$kind" = zram ]; then W_PEAK=$(( $(sample_orig zram "$peak") / PAGE )); else W_PEAK=$(echo "$peak" | jnum stored_pages); fi
    orig=$(sample_orig "$kind" "$peak"); compr=$(sample_compr "$kind" "$peak"); mem=$(sample_memused "$kind" "$peak")
    [ "$W_PEAK" -gt 0 ] || fail "$kind: stats never showed stored pages: $(echo "$peak" | cut -c1-300)"
    W_RATIO=$(ratio "$orig" "$compr")
    W_MEMRATIO=$(ratio "$orig" "$mem")
    # Not for a zblk device with --algo none (its own sample says), which
    # stores pages raw.
    [ "$kind" = zblk ] && [ "$(echo "$peak" | jget algorithm)" = none ] ||
        awk -v r="$W_RATIO" 'BEGIN { exit !(r > 1) }' || fail "$kind: compression ratio $W_RATIO not above 1 (orig $orig compr $compr)"
    W_WRITE=$(echo "$uj" | jget write_mb_s); W_VERIFY=$(echo "$uj" | jget verify_mb_s)
    W_FIGS="total_mb=$(echo "$uj" | jget total_mb) limit_mb=$ZBLK_LIMIT_MB wall_s=$W_WALL write_mb_s=$W_WRITE verify_mb_s=$W_VERIFY swapout_mb=$W_OUT_MB swapin_mb=$W_IN_MB peak_stored_pages=$W_PEAK ratio=$W_RATIO orig_per_mem=$W_MEMRATIO"
    echo "$W_FIGS" >/tmp/figures.swap.$kind
    rmdir "$CG" 2>/dev/null
    return 0
}

# The munmap workload of $2 MB against the active swap device of KIND ($1):
# page the region out, wait until the device holds it, unmap it, and wait for
# stored pages and memory to fall back to where they were. Sets M_FIGS and
# saves them in /tmp/figures.munmap.$1.$2.
#
# munmap_bench's output goes to a file of this call's own, created empty
# before the program starts: a shared file, truncated only by the background
# job's redirection, let the poll below read the previous call's line and
# then, once truncated, nothing ("only 0 kB ... paged out").
munmap_workload() {
    kind=$1 mb=$2
    procs=$ZBLK_MUNMAP_PROCS
    base=$(dev_stored "$kind"); basemem=$(dev_mem "$kind"); nf0=$(dev_notify_free "$kind")
    MUNMAP_CALL=$(( ${MUNMAP_CALL:-0} + 1 ))
    mout=/tmp/zblk-vm.mb.$MUNMAP_CALL go=/tmp/zblk-vm.go.$MUNMAP_CALL
    rm -f "$go"
    : >"$mout"
    munmap_bench --mb "$mb" --procs "$procs" --wait-file "$go" >"$mout" 2>&1 &
    bpid=$!
    track $bpid
    i=0
    while ! grep -q '"event":"paged_out"' "$mout"; do
        kill -0 $bpid 2>/dev/null || fail "$kind ${mb}MB: munmap_bench died: $(tail -c 300 "$mout")"
        [ $i -lt 1200 ] || fail "$kind ${mb}MB: page-out did not finish in 120 s"
        sleep 0.1; i=$((i + 1))
    done
    pl=$(grep '"event":"paged_out"' "$mout" | head -1)
    [ "$(echo "$pl" | jnum procs)" = "$procs" ] || fail "$kind ${mb}MB: page-out line is not this call's ($procs procs): $pl"
    swap_kb=$(echo "$pl" | jnum swap_kb)
    [ "$swap_kb" -ge $((procs * mb * 1024 * 9 / 10)) ] || fail "$kind ${mb}MB: only ${swap_kb} kB of $procs x ${mb} MB paged out"
    # Page-out on an asynchronous device completes later: wait for the device.
    want=$((base + swap_kb / 4 * 9 / 10))
    i=0
    while [ "$(dev_stored "$kind")" -lt "$want" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    full=$(dev_stored "$kind"); fullmem=$(dev_mem "$kind")
    [ "$full" -ge "$want" ] || fail "$kind ${mb}MB: device holds $full pages, want >= $want after page-out"
    t0=$(now)
    touch "$go"
    wait $bpid || fail "$kind ${mb}MB: munmap_bench failed: $(tail -c 300 "$mout")"
    rj=$(grep '"program":"munmap_bench"' "$mout" | tail -1)
    [ "$(echo "$rj" | jnum mb)" = "$mb" ] || fail "$kind ${mb}MB: munmap_bench result is not this call's: $rj"
    ms=$(echo "$rj" | jget munmap_ms_max)
    # Back to the baseline: at most 5% of the growth left (the swap slot
    # cache and partly used swap clusters may hold a few back).
    grow=$((full - base)); growmem=$((fullmem - basemem))
    i=0
    while :; do
        st=$(dev_stored "$kind"); mem=$(dev_mem "$kind")
        [ $((st - base)) -le $((grow / 20)) ] && [ $((mem - basemem)) -le $((growmem / 10)) ] && break
        [ "$(awk -v a="$(elapsed "$t0")" -v b="$ZBLK_SETTLE_S" 'BEGIN { print (a > b) }')" = 1 ] &&
            fail "$kind ${mb}MB: no fall-back after ${ZBLK_SETTLE_S}s: stored $base -> $full -> $st pages, mem $basemem -> $fullmem -> $mem"
        sleep 0.05
    done
    settle=$(elapsed "$t0")
    nf=$(( $(dev_notify_free "$kind") - nf0 ))
    [ "$nf" -ge $((grow * 9 / 10)) ] || fail "$kind ${mb}MB: notify_free grew by $nf, want >= 90% of $grow pages"
    label=${mb}MB
    [ "$procs" -gt 1 ] && label=${procs}x${mb}MB
    M_FIGS="$label: munmap_ms=$ms settle_s=$settle stored=$base/$full/$st mem_kb=$((basemem / 1024))/$((fullmem / 1024))/$((mem / 1024)) notify_free=+$nf"
    echo "$M_FIGS" >/tmp/figures.munmap.$kind.$mb
    return 0
}

# --- Handover workloads (crash, upgrade): a zblk swap device that gets a new
# daemon while usemem swaps through it and verifies every page.

# Starts the workload with PASSES ($1) verify passes on a new swap device
# (the rest: more `zblk add` flags), alone
# (another swap area, say the dead one swapkill leaves, would take part of
# its pages and its errors), and waits until it reaches swap. Sets U (its
# pid), BASE (mem_used_total before), CG, and DMESG_FROM: kernel messages
# from here on are this scenario's (lifecycle's kill -9 of a --no-recovery
# device logs I/O errors before it, on purpose).
handover_start() {
    grep -q "(deleted)" /proc/swaps && fail "a dead swap area from an earlier scenario is active (run swapkill last)"
    dmesg_mark
    local passes=$1
    shift
    zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --swap "$@"
    BASE=$(zstat | jnum mem_used_total)
    CG=$(cg_make "$SCEN" "$ZBLK_LIMIT_MB")
    in_cg usemem --mb "$ZBLK_USEMEM_MB" --procs "$ZBLK_USEMEM_PROCS" --sleep 1 --passes "$passes" >/tmp/zblk-vm.usemem 2>&1 &
    U=$!
    track $U
    local i=0
    while [ "$(zstat | jnum stored_pages)" -lt 4096 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
}

# Waits for the usemem workload $U (its output in /tmp/zblk-vm.usemem) and
# fails the scenario unless it verified every page and the kernel logged
# no swap error since dmesg_mark ($1 says when, for the message). Sets UJ,
# usemem's result line.
usemem_verified() {
    local urc
    wait $U
    urc=$?
    UJ=$(grep '"program":"usemem"' /tmp/zblk-vm.usemem | tail -1)
    [ "$urc" = 0 ] || fail "usemem exit $urc $1: $(tail -c 400 /tmp/zblk-vm.usemem | tr '\n' ' ')"
    [ "$(echo "$UJ" | jget ok)" = true ] || fail "usemem not ok $1: $UJ"
    [ "$(echo "$UJ" | jnum bad_pages)" = 0 ] || fail "usemem saw bad pages $1: $UJ"
    dmesg_new | grep -qiE 'segfault|SIGBUS|I/O error, dev ublkb|(read|write)-error on swap' &&
        fail "kernel saw errors $1: $(dmesg_new | grep -iE 'segfault|SIGBUS|I/O error|-error on swap' | tail -2 | tr '\n' '|')"
    return 0
}

# Waits for the workload after N handovers (WHAT: kills, restarts) and
# checks: usemem verified every page, the kernel saw no swap error since
# handover_start, stat counts N recoveries, and the memory falls back to
# BASE once the workload is gone (at most 1 MB + 2% of PEAK pages left).
# What the swap area still holds then is the kernel's swap cache, which it
# frees lazily (swap_settled checks that the device stores no more than
# that); swapoff and a discard of the whole device empty it, and the memory
# must then fall back: a handle the recoveries lost would keep its zspage.
# Sets UJ (usemem's result line), REC, SWAP_LEFT and MEM.
handover_finish() {
    local n=$1 what=$2 i
    usemem_verified "after $n $what"
    REC=$(zstat | jnum recoveries)
    [ "$REC" = "$n" ] || fail "stat shows recoveries=$REC after $n $what"
    rmdir "$CG" 2>/dev/null
    swap_settled "$ZID" "$PEAK"
    must swapoff "$ZDEV"
    must blkdiscard -f "$ZDEV"
    wait_no_pages "$ZID" 100
    wait_mem_back "$ZID" "$BASE" "$PEAK" 200
}
