# swapkill (run it alone or last): a device made with --no-recovery, and kill -9 of the
# daemon of an ACTIVE SWAP device while a workload swaps through it. Swapped
# pages are lost, so the workload may die (SIGBUS/SIGSEGV is acceptable);
# what must not happen: a hang of the workload, of `zblk del --force`, or of
# the guest, and `zblk add` must work afterwards. The kernel keeps the dead
# swap area as "(deleted)" in /proc/swaps (no path is left to swapoff it),
# which is why this scenario is not run before others.
zadd --size 512M --algo "$ZBLK_ALGO" --swap --no-recovery
old=$ZID
CG=$(cg_make swapkill 64)
in_cg usemem --mb 96 --procs 2 --sleep 5 >/tmp/zblk-vm.usemem 2>&1 &
u=$!
track $u
# Kill once a good part of the workload is in swap.
i=0
while [ "$(zstat | jnum stored_pages)" -lt 16384 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
pid=$(zdaemon_pid "$old") || fail "no process holds /dev/ublkc$old"
stored=$(zstat | jnum stored_pages)
kill -9 "$pid"
log "killed daemon $pid with $stored pages stored"
i=0
while kill -0 $u 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
kill -0 $u 2>/dev/null && fail "the workload still runs 60 s after the swap daemon died"
wait $u
urc=$?
log "workload exit $urc; /proc/swaps: $(tail -n +2 /proc/swaps | tr '\n' '|')"
t0=$(now)
timeout 30 zblk del -n "$old" --force >/tmp/zblk-vm.del 2>&1
drc=$?
log "zblk del -n $old --force: exit $drc in $(elapsed "$t0")s: $(head -1 /tmp/zblk-vm.del)"
[ "$drc" = 143 ] || [ "$drc" = 137 ] && fail "zblk del --force hangs after the daemon of an active swap device died"
zadd --size 64M --algo "$ZBLK_ALGO"
dd if=/dev/urandom of=/tmp/zblk-vm.src bs=4096 count=64 2>/dev/null
dd if=/tmp/zblk-vm.src of="$ZDEV" bs=4096 oflag=direct conv=notrunc 2>/dev/null || fail "write to the new $ZDEV failed"
dd if="$ZDEV" of=/tmp/zblk-vm.back bs=4096 count=64 iflag=direct 2>/dev/null || fail "read of the new $ZDEV failed"
cmp -s /tmp/zblk-vm.src /tmp/zblk-vm.back || fail "data read back from the new $ZDEV differs"
pass "killed with $stored pages in swap: workload ended (exit $urc), del --force exit $drc, new $ZDEV verified"
