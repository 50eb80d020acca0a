# swap: zblk as the swap device under cgroup memory pressure; every page verified.
zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --swap
is_swap "$ZDEV" || fail "$ZDEV is not in /proc/swaps after zblk add --swap"
# The memory reserve's provisioner runs SCHED_FIFO 1 (the daemon raises
# RLIMIT_RTPRIO before it drops CAP_SYS_NICE): 1 in its stat's policy field.
[ "$(reserve_policy)" = 1 ] || fail "provisioner policy $(reserve_policy), not SCHED_FIFO (1)"
grep -q "^$ZDEV .*100\$" /proc/swaps || log "note: priority is not 100: $(grep "^$ZDEV " /proc/swaps)"
swap_workload zblk
st=$(zstat)
[ "$(echo "$st" | jnum failed_writes)" = 0 ] || fail "failed_writes: $(echo "$st" | jnum failed_writes)"
[ "$(echo "$st" | jnum failed_reads)" = 0 ] || fail "failed_reads: $(echo "$st" | jnum failed_reads)"
pass "$W_FIGS"
