# attrib: `zblk stat --by cgroup` against the kernel's own accounting.
# Two cgroups under memory.high, one of usemem's 2.8:1 pages, one of the
# real-memory corpus when the guest has it (else usemem's pages of another
# seed), and a small usemem outside both; while their pages are held
# swapped out, each cgroup's PAGES on the device is within 2 % of its
# memory.swap.current, its compressed bytes are more than 0 and below its
# original bytes, the device's (unattributed) row is at most 2 % of its
# stored pages (no shmem runs), `zblk top --by cgroup -n 1` shows both
# cgroups, and a non-root user is refused in one line. Opt-in:
# tests/vm/run.sh --scenario attrib.
zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --swap
CORPUS=/lib/zblk-vm/data/realmem-dev.bin.zst
HOLD=40
CGA=$(cg_make attrib-a "$ZBLK_LIMIT_MB")
CG=$CGA in_cg usemem --mb "$ZBLK_USEMEM_MB" --procs 1 --sleep $HOLD >/tmp/zblk-vm.usemem-a 2>&1 &
pa=$!
track $pa
CGB=$(cg_make attrib-b "$ZBLK_LIMIT_MB")
if [ -f "$CORPUS" ]; then
    CG=$CGB in_cg usemem --mb "$ZBLK_USEMEM_MB" --procs 1 --sleep $HOLD --corpus "$CORPUS" >/tmp/zblk-vm.usemem-b 2>&1 &
else
    log "no $CORPUS: cgroup b gets usemem's pages of another seed"
    CG=$CGB in_cg usemem --mb "$ZBLK_USEMEM_MB" --procs 1 --sleep $HOLD --seed 7 >/tmp/zblk-vm.usemem-b 2>&1 &
fi
pb=$!
track $pb
usemem --mb 16 --procs 1 --sleep $HOLD >/tmp/zblk-vm.usemem-c 2>&1 &
pc=$!
track $pc

# Waits until the swap of both cgroups is above half the workload's size
# and has not moved for two seconds (written, pushed out, held).
swap_of() { cat "$1/memory.swap.current"; }
want=$((ZBLK_USEMEM_MB * 1048576 / 2))
last="" steady=0 waited=0
while [ "$steady" -lt 2 ]; do
    [ "$waited" -lt $((HOLD - 5)) ] || fail "cgroup swap never settled: a $(swap_of "$CGA") b $(swap_of "$CGB")"
    sleep 1
    waited=$((waited + 1))
    cur="$(swap_of "$CGA") $(swap_of "$CGB")"
    if [ "${cur%% *}" -ge "$want" ] && [ "${cur##* }" -ge "$want" ] && [ "$cur" = "$last" ]; then
        steady=$((steady + 1))
    else
        steady=0
    fi
    last=$cur
done
log "settled after ${waited}s: memory.swap.current a ${cur%% *} b ${cur##* }"

j=$(zblk stat --by cgroup -n "$ZID" --json 2>&1) || fail "zblk stat --by cgroup failed: $j"
flat=$(echo "$j" | tr -d '\n ')
# The JSON object of the row of cgroup $1 on this device.
row() { echo "$flat" | grep -o "{[^{}]*\"cgroup\":\"$1\"[^{}]*}" | head -1; }
sum_pages=0
for c in a b; do
    cg=/zblk-attrib-$c
    r=$(row "$cg")
    [ -n "$r" ] || fail "no row for $cg: $(echo "$flat" | cut -c1-600)"
    pages=$(echo "$r" | jnum pages)
    orig=$(echo "$r" | jnum orig_bytes)
    compr=$(echo "$r" | jnum compr_bytes)
    kernel=$(( $(swap_of "/sys/fs/cgroup/zblk-attrib-$c") / PAGE ))
    awk -v p="$pages" -v k="$kernel" 'BEGIN { d = p - k; if (d < 0) d = -d; exit !(k > 0 && d <= 0.02 * k) }' ||
        fail "$cg: $pages pages attributed, memory.swap.current says $kernel"
    [ "$compr" -gt 0 ] && [ "$compr" -lt "$orig" ] || fail "$cg: compressed $compr of $orig bytes"
    log "$cg: $pages pages ($kernel by memory.swap.current), $orig bytes in $compr"
    sum_pages=$((sum_pages + pages))
done
# No shmem here: what no process maps (the unattributed row) is the swap
# header and the swap cache's pages, at most 2 % of what the device stores.
un=$(echo "$flat" | grep -o '{[^{}]*"unattributed":true[^{}]*}' | head -1 | jnum pages)
stored=$(zstat_store stored_pages)
awk -v u="$un" -v s="$stored" 'BEGIN { exit !(s > 0 && u <= 0.02 * s + 16) }' ||
    fail "$un of the device's $stored stored pages are unattributed"
t=$(zblk top --by cgroup -n 1 2>&1) || fail "zblk top --by cgroup failed: $t"
echo "$t" | grep -q /zblk-attrib-a && echo "$t" | grep -q /zblk-attrib-b ||
    fail "zblk top --by cgroup lacks a cgroup: $(echo "$t" | head -5)"
grep -q '^nobody:x:65534:' /etc/passwd || fail "no user nobody in the guest's /etc/passwd"
e=$(su -s /bin/sh nobody -c "zblk stat --by cgroup" 2>&1) && fail "non-root was not refused: $e"
[ "$(echo "$e" | wc -l)" = 1 ] && echo "$e" | grep -q "needs root" || fail "non-root refusal: $e"
scan=$(echo "$flat" | grep -o '"scan":{[^}]*}')
for p in $pa $pb $pc; do
    wait "$p" || fail "usemem $p failed: $(tail -c 300 /tmp/zblk-vm.usemem-a /tmp/zblk-vm.usemem-b /tmp/zblk-vm.usemem-c)"
done
rmdir "$CGA" "$CGB" 2>/dev/null
pass "pages_a_b=$sum_pages stored=$stored unattributed=$un $scan"
