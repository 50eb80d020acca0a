# swap: zblk as the swap device under cgroup memory pressure; every page verified.
zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --swap
is_swap "$ZDEV" || fail "$ZDEV is not in /proc/swaps after zblk add --swap"
# The memory reserve's provisioner runs SCHED_FIFO 1 (the daemon raises
# RLIMIT_RTPRIO before it drops CAP_SYS_NICE): 1 in its stat's policy field.
[ "$(reserve_policy)" = 1 ] || fail "provisioner policy $(reserve_policy), not SCHED_FIFO (1)"
# Every page of the daemon's program is locked (ublk-target's
# safety::lock_program), not only the code it ran so far: each of its
# program's mappings resident (Rss = Size) and locked, not on fault (VmFlags
# "lo" without "lf"). Prints "size_kb resident_kb unlocked_mappings".
dpid=$(zdaemon_pid "$ZID")
prog=$(awk -v exe="$(readlink "/proc/$dpid/exe")" '
    /^[0-9a-f]+-[0-9a-f]+ / { on = ($NF == exe && $2 !~ /^---/) }
    on && $1 == "Size:" { s += $2 }
    on && $1 == "Rss:" { r += $2 }
    on && $1 == "VmFlags:" { lo = 0; lf = 0; for (i = 2; i <= NF; i++) { if ($i == "lo") lo = 1; if ($i == "lf") lf = 1 }; if (!lo || lf) u++ }
    END { printf "%d %d %d", s, r, u }' "/proc/$dpid/smaps")
psize=${prog%% *} prss=${prog#* } punl=${prog##* }
prss=${prss%% *}
[ "$psize" -gt 0 ] && [ "$prss" = "$psize" ] && [ "$punl" = 0 ] ||
    fail "daemon $dpid: program $psize kB mapped, $prss kB resident, $punl mappings not locked"
log "program: $psize kB mapped, all resident and locked"
# The daemon is an I/O flusher (its threads' allocations never recurse into
# I/O), all but the provisioner, whose reclaim may swap out and reach the
# OOM killer (src/provision.rs, allow_io_in_reclaim).
[ "$(thread_noio "$dpid" zblk)" = 1 ] || fail "daemon $dpid: queue threads' PF_MEMALLOC_NOIO: $(thread_noio "$dpid" zblk), not 1"
[ "$(thread_noio "$dpid" zblk-reserve)" = 0 ] || fail "daemon $dpid: provisioner's PF_MEMALLOC_NOIO: $(thread_noio "$dpid" zblk-reserve), not 0"
grep -q "^$ZDEV .*100\$" /proc/swaps || log "note: priority is not 100: $(grep "^$ZDEV " /proc/swaps)"
swap_workload zblk
st=$(zstat)
[ "$(echo "$st" | jnum failed_writes)" = 0 ] || fail "failed_writes: $(echo "$st" | jnum failed_writes)"
[ "$(echo "$st" | jnum failed_reads)" = 0 ] || fail "failed_reads: $(echo "$st" | jnum failed_reads)"
pass "$W_FIGS"
