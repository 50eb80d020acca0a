# remote: the backing device on another machine, through a protocol that
# already exists (the kernel's NVMe over TCP), and what a dead link does.
#
# The storage host is a second network namespace in the guest ("storage"),
# joined to the root namespace (the initiator) by a veth pair: 10.77.0.2
# there, 10.77.0.1 here. Its kernel NVMe-oF target (nvmet, nvmet-tcp,
# configured through configfs: no userspace server) exports two files of
# an ext4 file system on the scratch disk (/dev/vda: run.sh gives one to
# this scenario; never tmpfs, which is guest RAM that swaps onto zblk
# itself) as namespaces 1 and 2 of one subsystem; the port is linked from
# inside the storage namespace, so nvmet-tcp listens there. The initiator
# connects by writing its options to /dev/nvme-fabrics, with
# fast_io_fail_tmo=3 (an I/O fails 3 s after the connection is lost
# instead of waiting for it to come back), ctrl_loss_tmo=-1 (the
# controller reconnects for ever, so its namespaces, the daemon's open
# backing device, never go away) and reconnect_delay=1.
#
# 1. Swap across the link: a 1 GB lz4 zblk swap device with --backing-dev
#    the initiator's namespace 1 (/dev/nvmeXn1); a cold usemem of
#    ZBLK_USEMEM_MB and a hot one of a quarter of it, under ZBLK_LIMIT_MB;
#    `zblk idle --all` and `zblk writeback --type idle` while the hot one
#    runs. bd_count > 0 and equal to what writeback wrote, bd_bytes <=
#    bd_used_bytes <= bd_size, compr_data_size and mem_used_total down,
#    bd_reads grows while the cold one verifies; both verify every page.
# 2. Latency: a 64 MB device over namespace 2, 16 MB of it filled by
#    randio; 4 KB O_DIRECT reads (randio, queue depth 1) of its pages in
#    RAM, then after `zblk writeback --pages` of all of them (every read
#    now reads its block across the link); the same on a device over a
#    local file on the scratch disk. LAT lines: p50 and p99 in us, and the
#    ratio of each tier's median to the RAM one (same boot).
# 3. Faults, on the swap device of 1 (each workload in its own cgroup,
#    frozen through cgroup.freeze while it must not read):
#    - victim V (64 MB) written back whole while the link is up;
#    - W (128 MB) marked idle, its writeback started, and the target's
#      port removed while it runs: writeback fails in one line, bd_count
#      and bd_writes stay equal (nothing half switched), stored_pages
#      unchanged (the pages not written stay in RAM);
#    - the veth deleted too; V thawed: its swap-ins fail (EIO), the kernel
#      kills V with SIGBUS; meanwhile a healthy usemem H swaps through the
#      same device and verifies every page, and on the latency device one
#      written-back page read with dd fails with EIO while a page in RAM
#      reads back right (failed_reads counts it);
#    - the link and the port come back, the controller reconnects
#      ("live"); W thawed verifies every page (those written back before
#      the cut too); `zblk idle --all` and a writeback succeed again.
# 4. The whole machine short of memory: no cgroup, one usemem of
#    MemAvailable + 256 MB on the swap device, while `zblk writeback
#    --type idle --limit 2048` runs every 3 s across the link until it
#    has written its pages: every writeback succeeds and writes pages,
#    bd_reads grows (swap-ins from the remote tier), usemem verifies
#    every page, no OOM kill, no swap read error (writes the daemon
#    refuses for want of memory are counted), the daemon lives.
#
# Opt-in, by name (not in run.sh's default list); it takes longer than the
# default 360 s a scenario gets under TCG:
#   ZBLK_VM_ARGS='zblk.timeout=1500' bash tests/vm/run.sh --scenario remote --timeout 2400
SCEN=remote
dmesg_mark
NQN=nqn.2026-12.dev.zblk:remote-tier
HOST_IP=10.77.0.1 STOR_IP=10.77.0.2 TRSVCID=4420
NVMET=/sys/kernel/config/nvmet
SUBSYS=$NVMET/subsystems/$NQN PORT=$NVMET/ports/1
SCRATCH=/mnt/zblk-scratch
FAST_IO_FAIL=3 CTRL_LOSS=-1

# ---- the storage host and the link -------------------------------------------

# Everything this scenario set up, undone (also on failure): the devices
# first (they hold the namespaces open), the controller, the target, the
# namespace, the file system.
teardown() {
    swapoff -a 2>/dev/null
    zblk del --all --force >/dev/null 2>&1
    [ -n "${CTRL:-}" ] && echo 1 >"$CTRL/delete_controller" 2>/dev/null
    rm -f "$PORT/subsystems/$NQN" 2>/dev/null
    for n in 1 2; do
        echo 0 >"$SUBSYS/namespaces/$n/enable" 2>/dev/null
        rmdir "$SUBSYS/namespaces/$n" 2>/dev/null
    done
    rmdir "$PORT" "$SUBSYS" 2>/dev/null
    ip link del veth-host 2>/dev/null
    ip netns del storage 2>/dev/null
    umount "$SCRATCH" 2>/dev/null
}
rfail() {
    log "nvme: $(cat "${CTRL:-/nonexistent}/state" 2>/dev/null); dmesg: $(dmesg_new | grep -iE 'nvme|I/O error|swap' | tail -6 | tr '\n' '|')"
    teardown
    fail "$@"
}

# The veth pair between the root namespace and "storage", addressed and up.
link_up() {
    ip link add veth-host type veth peer name veth-stor || rfail "cannot make the veth pair"
    ip link set veth-stor netns storage || rfail "cannot move veth-stor into the storage namespace"
    ip addr add "$HOST_IP/24" dev veth-host && ip link set veth-host up &&
        ip -n storage addr add "$STOR_IP/24" dev veth-stor && ip -n storage link set veth-stor up &&
        ip -n storage link set lo up || rfail "cannot address the veth pair"
}
# Deleting one end deletes both: the cable pulled.
link_down() { ip link del veth-host || rfail "cannot delete the veth pair"; }

# nvmet-tcp listens in the network namespace of the process that links the
# port to the subsystem: link it from inside "storage" (nsenter keeps the
# mounts, so configfs stays where it is; `ip netns exec` remounts /sys).
port_up() {
    nsenter --net=/run/netns/storage ln -s "$SUBSYS" "$PORT/subsystems/$NQN" ||
        rfail "cannot link the target's port from the storage namespace"
}
port_down() { rm "$PORT/subsystems/$NQN" || rfail "cannot remove the target's port"; }

# Namespace $1 of the subsystem: file $2 of $3.
export_file() {
    truncate -s "$3" "$2" || rfail "cannot make $2"
    mkdir "$SUBSYS/namespaces/$1" && printf '%s' "$2" >"$SUBSYS/namespaces/$1/device_path" &&
        echo 1 >"$SUBSYS/namespaces/$1/enable" || rfail "nvmet refused namespace $1 ($2)"
}

# Waits up to $1 s for the controller's state to be "live".
wait_live() {
    i=0
    while [ "$(cat "$CTRL/state" 2>/dev/null)" != live ] && [ $i -lt $(( $1 * 10 )) ]; do sleep 0.1; i=$((i + 1)); done
    [ "$(cat "$CTRL/state" 2>/dev/null)" = live ] || rfail "the controller is '$(cat "$CTRL/state" 2>/dev/null)', not live, after $1 s"
}

# The block device name (nvmeXnY) of namespace id $1.
ns_disk() {
    for d in /sys/block/nvme*n*; do
        case ${d##*/} in *c*) continue ;; esac
        [ "$(cat "$d/nsid" 2>/dev/null)" = "$1" ] && { echo "${d##*/}"; return 0; }
    done
}

storage_up() {
    for m in nvmet_tcp nvme_tcp veth virtio_blk; do
        [ -d /sys/module/$m ] || grep -qx "$m" /lib/zblk-vm/modules/builtin 2>/dev/null ||
            fail "no $m in this kernel (run.sh packs it as an optional module)"
    done
    [ -x /usr/sbin/ip ] || fail "no iproute2 ip in the guest (busybox's has no netns or veth)"
    [ -b /dev/vda ] || fail "no scratch disk /dev/vda (run.sh gives one with --disk)"
    must mkfs.ext4 -q -F /dev/vda
    mkdir -p "$SCRATCH"
    must mount -t ext4 /dev/vda "$SCRATCH"
    ip netns add storage || rfail "cannot make the storage network namespace"
    link_up
    grep -q ' /sys/kernel/config ' /proc/mounts || mount -t configfs configfs /sys/kernel/config ||
        rfail "cannot mount configfs"
    mkdir "$SUBSYS" && echo 1 >"$SUBSYS/attr_allow_any_host" || rfail "nvmet refused subsystem $NQN"
    export_file 1 "$SCRATCH/export1.img" 768M
    export_file 2 "$SCRATCH/export2.img" 128M
    mkdir "$PORT" && echo tcp >"$PORT/addr_trtype" && echo ipv4 >"$PORT/addr_adrfam" &&
        echo "$STOR_IP" >"$PORT/addr_traddr" && echo "$TRSVCID" >"$PORT/addr_trsvcid" ||
        rfail "nvmet refused the TCP port"
    port_up
    printf 'transport=tcp,traddr=%s,trsvcid=%s,nqn=%s,ctrl_loss_tmo=%s,fast_io_fail_tmo=%s,reconnect_delay=1' \
        "$STOR_IP" "$TRSVCID" "$NQN" "$CTRL_LOSS" "$FAST_IO_FAIL" >/dev/nvme-fabrics ||
        rfail "connect through /dev/nvme-fabrics failed: $(dmesg_new | grep -i nvme | tail -2 | tr '\n' '|')"
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$NQN" ] && CTRL=$c
    done
    [ -n "${CTRL:-}" ] || rfail "no controller of $NQN in /sys/class/nvme"
    wait_live 30
    # The disks nvmeXnY (multipath heads, or the one path) by their nsid:
    # Y is the order the namespaces were found in, not their id.
    i=0
    while :; do
        NS1=$(ns_disk 1) NS2=$(ns_disk 2)
        [ -n "$NS1" ] && [ -n "$NS2" ] && [ -b "/dev/$NS1" ] && [ -b "/dev/$NS2" ] && break
        [ $i -lt 100 ] || rfail "no nvme namespaces 1 and 2 after connecting ($(ls /sys/block | tr '\n' ' '))"
        sleep 0.1; i=$((i + 1))
    done
    NS1=/dev/$NS1 NS2=/dev/$NS2
    log "storage: $NQN over tcp $STOR_IP:$TRSVCID (storage namespace), $(basename "$CTRL") $(cat "$CTRL/state"), namespaces $NS1 $(( $(cat /sys/block/${NS1#/dev/}/size) / 2048 )) MB, $NS2 $(( $(cat /sys/block/${NS2#/dev/}/size) / 2048 )) MB"
}

# ---- helpers -------------------------------------------------------------------

# The value after word $2 in `zblk writeback`'s "selected N written N ..." line.
word_after() { echo "$1" | tr ' ' '\n' | grep -A1 -x "$2" | tail -1; }

# usemem's result line in file $1, checked: every page verified.
verified() {
    uj=$(grep '"program":"usemem"' "$1" | tail -1)
    [ "$(echo "$uj" | jget ok)" = true ] && [ "$(echo "$uj" | jnum bad_pages)" = 0 ] ||
        rfail "usemem ($2): $(tail -c 300 "$1" | tr '\n' ' ')"
}

# Starts usemem "$2..." in its own cgroup zblk-remote-$1 (memory.high 32 MB)
# with a --mark file; sets PID_$1 once it has written all its pages.
start_held() {
    n=$1
    shift
    CG=$(cg_make "$SCEN-$n" 32)
    rm -f /tmp/zblk-vm.mark.$n
    in_cg usemem --mark /tmp/zblk-vm.mark.$n "$@" >/tmp/zblk-vm.$n 2>&1 &
    eval "PID_$n=$!"
    track $!
    i=0
    while ! grep -q written /tmp/zblk-vm.mark.$n 2>/dev/null; do
        [ $i -lt 1800 ] || rfail "usemem $n did not finish writing in 180 s"
        sleep 0.1; i=$((i + 1))
    done
}
freeze() { echo "$2" >"/sys/fs/cgroup/zblk-$SCEN-$1/cgroup.freeze" || rfail "cannot (un)freeze $1"; }

# Median and p99 (us) of randio's reads on device $1 (16 MB of it), as
# "p50 p99".
read_lat() {
    r=$(randio --dev "$1" --mb 16 --write-pct 0 --count "${LAT_OPS:-2000}" --seconds 0 2>&1) ||
        rfail "randio reads on $1: $(echo "$r" | tail -c 300)"
    echo "$r" | tr -d '\n' | sed 's/.*"read":{//' | awk -F'[,:}]' '{ for (i = 1; i < NF; i++) { if (a == "" && $i ~ /p50_us/) a = $(i + 1); if (b == "" && $i ~ /p99_us/) b = $(i + 1) } print a, b }'
}

# LAT line of the device over backing device $1, named $2: reads of 16 MB
# of pages in RAM, then of the same pages written back. Keeps the device
# (ZID) when $3 is "keep".
tier_latency() {
    zadd --size 64M --algo "$ZBLK_ALGO" --backing-dev "$1"
    r=$(randio --dev "$ZDEV" --mb 16 --prefill --write-pct 0 --count 1 --seconds 0 2>&1) ||
        rfail "randio prefill of $ZDEV: $r"
    ram=$(read_lat "$ZDEV")
    wb=$(zblk writeback -n "$ZID" --pages 0-4095 2>&1) || rfail "writeback to $2: $wb"
    [ "$(word_after "$wb" written)" = 4096 ] || rfail "writeback to $2 wrote $(word_after "$wb" written) of 4096 pages: $wb"
    bd0=$(zstat | jnum bd_reads)
    tier=$(read_lat "$ZDEV")
    bdr=$(( $(zstat | jnum bd_reads) - bd0 ))
    [ "$bdr" -ge "${LAT_OPS:-2000}" ] || rfail "$2: only $bdr backing reads for ${LAT_OPS:-2000} reads of written-back pages"
    set -- "$@" $ram $tier
    echo "LAT $SCEN tier=$2 kernel=$(uname -r) ram_p50_us=$4 ram_p99_us=$5 tier_p50_us=$6 tier_p99_us=$7 p50_vs_ram=$(ratio "$6" "$4")x"
    LAT_FIGS="$LAT_FIGS $2 p50/p99 ${6}/${7} us (RAM ${4}/${5});"
    [ "$3" = keep ] || must zblk del -n "$ZID" >/dev/null
}

storage_up

# ---- 1. swap across the link ----------------------------------------------------

zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --backing-dev "$NS1" --swap
SWAP_ID=$ZID
[ "$(zstat | jget backing_dev)" = "$NS1" ] || rfail "stat's backing_dev is '$(zstat | jget backing_dev)', not $NS1"
CG=$(cg_make "$SCEN" "$ZBLK_LIMIT_MB")
hot_cold_hold 30 || rfail "only $ST pages stored before the hold"
st=$ST
j0=$(zstat)
mem0=$(echo "$j0" | jnum mem_used_total) compr0=$(echo "$j0" | jnum compr_data_size)
must zblk idle -n "$ZID" --all >/dev/null
t0=$(now)
wb=$(zblk writeback -n "$ZID" --type idle 2>&1) || rfail "writeback across the link failed: $wb"
wb_s=$(elapsed "$t0")
written=$(word_after "$wb" written) wbytes=$(word_after "$wb" bytes)
j1=$(zstat)
bdc=$(echo "$j1" | jnum bd_count) bdw=$(echo "$j1" | jnum bd_writes) bdb=$(echo "$j1" | jnum bd_bytes)
bdu=$(echo "$j1" | jnum bd_used_bytes) bds=$(echo "$j1" | jnum bd_size) bdr0=$(echo "$j1" | jnum bd_reads)
mem1=$(echo "$j1" | jnum mem_used_total) compr1=$(echo "$j1" | jnum compr_data_size)
log "stored=$st writeback in ${wb_s}s: $wb; bd_count=$bdc bd_writes=$bdw bd_bytes=$bdb bd_used_bytes=$bdu bd_size=$bds mem $mem0 -> $mem1 compr $compr0 -> $compr1"
[ "${written:-0}" -gt 0 ] && [ "$bdc" -gt 0 ] || rfail "nothing written back: $wb"
[ "$bdw" = "$written" ] || rfail "bd_writes $bdw is not what writeback wrote ($written)"
[ "$bdc" -le "$bdw" ] || rfail "bd_count $bdc > bd_writes $bdw"
[ "$bdb" -le "$bdu" ] && [ "$bdu" -le "$bds" ] || rfail "bd_bytes $bdb, bd_used_bytes $bdu, bd_size $bds out of order"
[ "$compr1" -lt "$compr0" ] || rfail "compr_data_size did not drop: $compr0 -> $compr1"
[ $(( mem0 - mem1 )) -ge $(( wbytes / 2 )) ] || rfail "mem_used_total dropped $(( mem0 - mem1 )) bytes for $wbytes written back"
hold_end
wait $COLD
crc=$?
wait $HOT
hrc=$?
verified /tmp/zblk-vm.cold cold
verified /tmp/zblk-vm.hot hot
[ "$crc" = 0 ] && [ "$hrc" = 0 ] || rfail "usemem exits: cold $crc hot $hrc"
bdr1=$(zstat | jnum bd_reads)
[ "$bdr1" -gt "$bdr0" ] || rfail "bd_reads did not grow while the cold pages were verified ($bdr0 -> $bdr1)"
dmesg_new | grep -qiE 'segfault|SIGBUS|I/O error|(read|write)-error on swap' &&
    rfail "kernel saw errors: $(dmesg_new | grep -iE 'I/O error|-error on swap' | tail -2 | tr '\n' '|')"
rmdir "$CG" 2>/dev/null
SWAP_FIGS="stored=$st written_back=$written ($wbytes bytes) in ${wb_s}s, bd_reads $bdr0 -> $bdr1, mem_used_total $mem0 -> $mem1"
log "1. swap across the link: $SWAP_FIGS; both usemem runs verified every page"

# ---- 2. latency: RAM, the remote tier, a local file ---------------------------------

LAT_FIGS=""
truncate -s 128M "$SCRATCH/local.img" || rfail "cannot make $SCRATCH/local.img"
tier_latency "$SCRATCH/local.img" local-file drop
tier_latency "$NS2" nvme-tcp keep
LAT_ID=$ZID LAT_DEV=$ZDEV
# Pages 4096-4159 of the latency device: in RAM, for the dead-link reads.
head -c 262144 /dev/urandom >/tmp/zblk-vm.ram-pages
must dd if=/tmp/zblk-vm.ram-pages of="$LAT_DEV" bs=4096 seek=4096 oflag=direct >/dev/null
ZID=$SWAP_ID

# ---- 3. faults --------------------------------------------------------------------

# V: written back whole while the link is up, then frozen.
start_held v --mb 64 --sleep 3 --seed 11
freeze v 1
must zblk idle -n "$ZID" --all >/dev/null
wb=$(zblk writeback -n "$ZID" --type idle 2>&1) || rfail "writeback of V failed: $wb"
[ "$(word_after "$wb" written)" -gt 1000 ] || rfail "V: only $(word_after "$wb" written) pages written back: $wb"
# W: marked idle, its writeback started, the target's port removed meanwhile.
start_held w --mb 128 --sleep 3 --seed 13
freeze w 1
must zblk idle -n "$ZID" --all >/dev/null
j0=$(zstat)
st0=$(echo "$j0" | jnum stored_pages) bdc0=$(echo "$j0" | jnum bd_count) bdw0=$(echo "$j0" | jnum bd_writes)
fr0=$(echo "$j0" | jnum failed_reads)
zblk writeback -n "$ZID" --type idle >/tmp/zblk-vm.wb 2>&1 &
WB=$!
sleep 0.5
port_down
t0=$(now)
wait $WB && rfail "writeback finished before the port went down (W too small?): $(cat /tmp/zblk-vm.wb)"
wb_fail_s=$(elapsed "$t0")
e=$(cat /tmp/zblk-vm.wb)
[ "$(echo "$e" | wc -l)" = 1 ] && echo "$e" | grep -qi "error" || rfail "failed writeback said: '$e'"
j1=$(zstat)
bdc=$(echo "$j1" | jnum bd_count) bdw=$(echo "$j1" | jnum bd_writes) st1=$(echo "$j1" | jnum stored_pages)
cut_written=$(( bdw - bdw0 ))
log "writeback with the port removed: failed ${wb_fail_s}s after the cut, '$e'; written before the cut: $cut_written pages; bd_count $bdc0 -> $bdc, bd_writes $bdw0 -> $bdw, stored $st0 -> $st1"
[ "$st1" = "$st0" ] || rfail "stored_pages changed across the failed writeback: $st0 -> $st1"
# V and W are frozen: nothing is discarded meanwhile, so every page
# written counts once in bd_count too.
[ $(( bdc - bdc0 )) = "$cut_written" ] || rfail "bd_count grew by $(( bdc - bdc0 )), bd_writes by $cut_written across the failed writeback"
# The cable pulled too, then V thawed: its swap-ins fail.
link_down
H_CG=$(cg_make "$SCEN-h" 32)
CG=$H_CG
in_cg usemem --mb 64 --passes 3 --seed 17 >/tmp/zblk-vm.h 2>&1 &
H=$!
track $H
freeze v 0
wait "$PID_v"
vrc=$?
# One process: usemem itself dies (exit 128 + 7); more: a worker does.
[ "$vrc" = 135 ] || grep -qE 'SIGBUS|signal: 7' /tmp/zblk-vm.v || rfail "V (exit $vrc) was not killed by SIGBUS: $(tail -c 300 /tmp/zblk-vm.v | tr '\n' ' ')"
# The latency device: a written-back page fails with EIO, a page in RAM reads.
if e=$(dd if="$LAT_DEV" of=/dev/null bs=4096 count=1 skip=7 iflag=direct 2>&1); then
    rfail "a written-back page read with the link down: $e"
fi
echo "$e" | grep -qi "Input/output error" || rfail "a written-back page's read failed, but not with EIO: $e"
dd if="$LAT_DEV" bs=4096 skip=4096 count=64 iflag=direct 2>/dev/null | cmp -s - /tmp/zblk-vm.ram-pages ||
    rfail "pages in RAM of the latency device read back changed with the link down"
fr_lat=$(zstat "$LAT_ID" | jnum failed_reads)
[ "$fr_lat" -ge 1 ] || rfail "the latency device counts $fr_lat failed reads after an EIO"
wait $H
hrc=$?
verified /tmp/zblk-vm.h "healthy, link down"
[ "$hrc" = 0 ] || rfail "healthy usemem exit $hrc with the link down"
fr1=$(zstat | jnum failed_reads)
[ "$fr1" -gt "$fr0" ] || rfail "failed_reads did not grow ($fr0 -> $fr1) when V's swap-ins failed"
zdaemon_pid "$ZID" >/dev/null || rfail "the swap device's daemon is gone"
log "link down: V killed by SIGBUS (exit $vrc), swap device failed_reads $fr0 -> $fr1; latency device: dd of a written-back page 'Input/output error', 64 pages in RAM read back right (failed_reads $fr_lat); H verified every page"
# The link and the port come back; the controller reconnects.
link_up
log "veth pair back"
port_up
log "target's port back"
t0=$(now)
wait_live 60
live_s=$(elapsed "$t0")
log "controller live after ${live_s}s; thawing W"
freeze w 0
wait "$PID_w"
wrc=$?
verified /tmp/zblk-vm.w "W, after the reconnect"
[ "$wrc" = 0 ] || rfail "W exit $wrc after the reconnect"
must zblk idle -n "$ZID" --all >/dev/null
# Something to write back: a fresh held workload.
start_held r --mb 64 --sleep 3 --seed 19
must zblk idle -n "$ZID" --all >/dev/null
wb=$(zblk writeback -n "$ZID" --type idle 2>&1) || rfail "writeback after the reconnect failed: $wb"
again=$(word_after "$wb" written)
[ "${again:-0}" -gt 0 ] || rfail "writeback after the reconnect wrote nothing: $wb"
wait "$PID_r"
rrc=$?
verified /tmp/zblk-vm.r "R, written back after the reconnect"
[ "$rrc" = 0 ] || rfail "R exit $rrc"
j2=$(zstat)
bdc=$(echo "$j2" | jnum bd_count) bdw=$(echo "$j2" | jnum bd_writes) bdb=$(echo "$j2" | jnum bd_bytes)
bdu=$(echo "$j2" | jnum bd_used_bytes) bds=$(echo "$j2" | jnum bd_size)
[ "$bdc" -le "$bdw" ] && [ "$bdb" -le "$bdu" ] && [ "$bdu" -le "$bds" ] ||
    rfail "after the reconnect: bd_count $bdc bd_writes $bdw bd_bytes $bdb bd_used_bytes $bdu bd_size $bds out of order"
dd if="$LAT_DEV" bs=4096 skip=4096 count=64 iflag=direct 2>/dev/null | cmp -s - /tmp/zblk-vm.ram-pages ||
    rfail "pages in RAM of the latency device changed after the reconnect"
r=$(randio --dev "$LAT_DEV" --mb 16 --write-pct 0 --count 500 --seconds 0 2>&1) ||
    rfail "written-back pages of the latency device after the reconnect: $(echo "$r" | tail -c 300)"
log "reconnected (live ${live_s}s after the link came back); W verified every page ($cut_written of them written back before the cut); writeback again: $wb"

# ---- 4. the whole machine short of memory, writing back across the link ------------

# No cgroup: one process larger than what the machine has free, so that
# kswapd and direct reclaim swap onto the device, while the daemon writes
# idle pages back across the link every 3 s (until the process has
# written all its pages: a verify pass reading every page across the
# emulated link would take most of an hour) and then serves the
# swap-ins of the ones written back.
avail=$(awk '/^MemAvailable/ { print int($2 / 1024) }' /proc/meminfo)
big=$(( avail + 256 ))
j0=$(zstat)
bdr0=$(echo "$j0" | jnum bd_reads) bdw0=$(echo "$j0" | jnum bd_writes)
dmesg_mark
rm -f /tmp/zblk-vm.mark.big
usemem --mb "$big" --seed 23 --mark /tmp/zblk-vm.mark.big >/tmp/zblk-vm.big 2>&1 &
BIG=$!
track $BIG
t0=$(now)
rounds=0 wbn=0 wbfail=0
while kill -0 $BIG 2>/dev/null && ! grep -q written /tmp/zblk-vm.mark.big 2>/dev/null; do
    sleep 3
    zblk idle -n "$ZID" --all >/dev/null 2>&1
    if wb=$(zblk writeback -n "$ZID" --type idle --limit 2048 2>&1); then
        rounds=$((rounds + 1)) wbn=$(( wbn + $(word_after "$wb" written) ))
    else
        wbfail=$((wbfail + 1))
        log "writeback under pressure failed: $wb"
    fi
done
wait $BIG
brc=$?
big_s=$(elapsed "$t0")
verified /tmp/zblk-vm.big "whole machine"
[ "$brc" = 0 ] || rfail "the whole-machine usemem exit $brc"
j1=$(zstat)
bdr=$(( $(echo "$j1" | jnum bd_reads) - bdr0 )) bdw=$(( $(echo "$j1" | jnum bd_writes) - bdw0 ))
fw=$(echo "$j1" | jnum failed_writes)
# A write the daemon refuses for want of memory is a "Write-error on
# swap-device": the page stays in RAM (docs/daemon.md); counted, not a
# failure. A failed read would be.
werr=$(dmesg_new | grep -c 'Write-error on swap')
log "whole machine: usemem of $big MB (MemAvailable $avail MB) verified in ${big_s}s; $rounds writebacks wrote $wbn pages ($wbfail failed), bd_writes +$bdw bd_reads +$bdr, failed_writes $fw, swap write errors $werr"
[ "$wbfail" = 0 ] || rfail "$wbfail writebacks failed under memory pressure"
[ "$wbn" -gt 0 ] && [ "$bdr" -gt 0 ] || rfail "under memory pressure nothing was written back ($wbn) or read back ($bdr) across the link"
dmesg_new | grep -qiE 'oom-kill|Out of memory|segfault|SIGBUS|read-error on swap' &&
    rfail "kernel under memory pressure: $(dmesg_new | grep -iE 'oom-kill|Out of memory|read-error on swap' | tail -2 | tr '\n' '|')"
zdaemon_pid "$ZID" >/dev/null || rfail "the swap device's daemon is gone after the memory pressure"
PRESSURE_FIGS="usemem of $big MB without a cgroup verified in ${big_s}s while $rounds writebacks moved $wbn pages across the link (bd_reads +$bdr, failed_writes $fw)"
teardown
pass "nvme-tcp backing: $SWAP_FIGS; latency:$LAT_FIGS dead link: writeback failed in ${wb_fail_s}s keeping every page, V killed by SIGBUS alone, H verified; after reconnect W verified, writeback wrote $again; whole machine: $PRESSURE_FIGS"
