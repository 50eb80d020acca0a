# munmap: swapped-out regions are unmapped; discard gives every page back.
zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --swap
is_swap "$ZDEV" || fail "$ZDEV is not in /proc/swaps after zblk add --swap"
figs=""
for mb in $ZBLK_MUNMAP_SIZES; do
    munmap_workload zblk "$mb"
    log "$M_FIGS"
    figs="$figs $M_FIGS;"
done
pass "$figs"
