# attrib: `zblk stat --by cgroup|process` against the kernel's own
# accounting, and `zblk writeback --cgroup`.
#
# A swap device over a loop backing device; cgroup a (memory.high at half
# zblk.limit_mb) holds usemem's 2.8:1 pages written once and then shared
# by a fork (usemem --fork: two processes map every page), cgroup b the
# real-memory corpus (run.sh --data .../realmem-dev.bin.zst; else usemem's
# pages of another seed), cgroup c (no limit) a 16 MB usemem pushed out by
# memory.reclaim. While their pages are held swapped out:
#  - each of a's and b's PAGES is within 2 % of its memory.swap.current
#    or above that less the cgroup's swap cache (memory.stat swapcached:
#    a page swapped back in whose slot the swap cache keeps is in no page
#    table) (a's shared pages counted once), its compressed bytes more than 0 and
#    below its original bytes;
#  - a's SHARED is at least 98 % of its PAGES and each of its two
#    processes' rows (--by process) has a's pages; b's SHARED is 0;
#  - c's usemem's swap offsets, read here from /proc/PID/pagemap with dd
#    and od (not by zblk), are its row's pages, and the sizes `zblk dump`
#    gives those offsets add up to its row's compressed bytes;
#  - the (unattributed) row is at most 2 % of the device's stored pages
#    (no shmem runs); `zblk top --by cgroup -n 1` shows a and b; a
#    non-root user is refused in one line;
#  - `zblk writeback --cgroup /zblk-attrib-a` writes back a's pages and no
#    other: a's WRITTEN BACK is what it wrote (at least 98 % of a's
#    pages), b's and c's are 0, and the device's bd_count is that count;
# then every process (the forked ones too) verifies every page. Opt-in:
#   tests/vm/run.sh --scenario attrib --data .../realmem-dev.bin.zst
CORPUS=/lib/zblk-vm/data/realmem-dev.bin.zst
# The workloads hold their pages until $GO exists (usemem --hold-file):
# the scans below take minutes under TCG.
GO=/tmp/zblk-vm.attrib.go
rm -f "$GO"
SETTLE=90
loop_backing /tmp/zblk-attrib.img 512M
zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --backing-dev "$BD" --swap
# On any way out, the workloads go (their swapped pages with them): a
# failure must not leave them holding the console until they are told to verify.
stop_all() {
    for c in a b c; do
        kill -9 $(cat "/sys/fs/cgroup/zblk-attrib-$c/cgroup.procs" 2>/dev/null) 2>/dev/null
    done
}
trap stop_all EXIT
LIMIT=$((ZBLK_LIMIT_MB / 2))
CGA=$(cg_make attrib-a "$LIMIT")
CG=$CGA in_cg usemem --mb "$ZBLK_USEMEM_MB" --procs 1 --hold-file "$GO" --fork >/tmp/zblk-vm.usemem-a 2>&1 &
pa=$!
track $pa
CGB=$(cg_make attrib-b "$LIMIT")
if [ -f "$CORPUS" ]; then
    CG=$CGB in_cg usemem --mb "$ZBLK_USEMEM_MB" --procs 1 --hold-file "$GO" --corpus "$CORPUS" >/tmp/zblk-vm.usemem-b 2>&1 &
else
    log "no $CORPUS: cgroup b gets usemem's pages of another seed"
    CG=$CGB in_cg usemem --mb "$ZBLK_USEMEM_MB" --procs 1 --hold-file "$GO" --seed 7 >/tmp/zblk-vm.usemem-b 2>&1 &
fi
pb=$!
track $pb
CGC=$(cg_make attrib-c 4096)
CG=$CGC in_cg usemem --mb 16 --procs 1 --hold-file "$GO" --seed 3 >/tmp/zblk-vm.usemem-c 2>&1 &
pc=$!
track $pc

# Waits until the swap of both cgroups is above a quarter of the
# workload's size and has not moved for two seconds (written, pushed out,
# held).
swap_of() { cat "$1/memory.swap.current"; }
want=$((ZBLK_USEMEM_MB * 1048576 / 4))
last="" steady=0 waited=0
while [ "$steady" -lt 2 ]; do
    [ "$waited" -lt "$SETTLE" ] || fail "cgroup swap never settled: a $(swap_of "$CGA") b $(swap_of "$CGB")"
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
# A page swapped back in (b copies from its corpus while it writes) keeps
# its slot in the swap cache while mapped: memory.swap.current counts it,
# no page table holds its swap entry (the scan's (unattributed) row).
# Pushing every cgroup out makes such pages swap entries again. c has no
# limit: its pages go out on this request alone (a partial reclaim is
# EAGAIN).
for cg in "$CGA" "$CGB" "$CGC"; do
    echo 1G >"$cg/memory.reclaim" 2>/dev/null
done
[ "$(swap_of "$CGC")" -gt 0 ] || fail "memory.reclaim pushed none of c's pages out"

# The JSON object of the row whose "$1" is "$2", from the flattened JSON $3.
row() { echo "$3" | grep -oE "\{[^{}]*\"$1\":$2(,[^{}]*)?\}" | head -1; }
j=$(zblk stat --by cgroup -n "$ZID" --json 2>&1) || fail "zblk stat --by cgroup failed: $j"
flat=$(echo "$j" | tr -d '\n ')
sum_pages=0
for c in a b; do
    cg=/zblk-attrib-$c
    r=$(row cgroup "\"$cg\"" "$flat")
    [ -n "$r" ] || fail "no row for $cg: $(echo "$flat" | cut -c1-600)"
    pages=$(echo "$r" | jnum pages)
    orig=$(echo "$r" | jnum orig_bytes)
    compr=$(echo "$r" | jnum compr_bytes)
    shared=$(echo "$r" | jnum shared_pages)
    kernel=$(($(swap_of "/sys/fs/cgroup/zblk-attrib-$c") / PAGE))
    # The swap cache's pages of the cgroup: those mapped again (swapped
    # back in, slot kept) count in memory.swap.current and in no page
    # table; so the row is between memory.swap.current less them and
    # memory.swap.current, within 2 %.
    cached=$(awk '$1 == "swapcached" { print int($2 / 4096) }' "/sys/fs/cgroup/zblk-attrib-$c/memory.stat")
    awk -v p="$pages" -v k="$kernel" -v c="${cached:-0}" 'BEGIN { exit !(k > 0 && p >= 0.98 * (k - c) && p <= 1.02 * k) }' ||
        fail "$cg: $pages pages attributed, memory.swap.current says $kernel, $cached of them in the swap cache; row $r; VmSwap $(for p in $(cat "/sys/fs/cgroup/zblk-attrib-$c/cgroup.procs"); do grep VmSwap "/proc/$p/status"; done | tr -s ' \n' ' '); $(grep -E 'swap|zswap' "/sys/fs/cgroup/zblk-attrib-$c/memory.stat" | tr '\n' ' '); $(echo "$flat" | grep -o '"scan":{[^}]*}')"
    [ "$compr" -gt 0 ] && [ "$compr" -lt "$orig" ] || fail "$cg: compressed $compr of $orig bytes"
    log "$cg: $pages pages ($kernel by memory.swap.current, ${cached:-0} of them in the swap cache), $shared shared, $orig bytes in $compr"
    eval "pages_$c=$pages shared_$c=$shared"
    sum_pages=$((sum_pages + pages))
done
j=$(zblk stat --by process -n "$ZID" --json 2>&1) || fail "zblk stat --by process failed: $j"
procs=$(echo "$j" | tr -d '\n ')
# a: every page is its two processes' (usemem and its fork), counted
# once in a's row, in full in each of their rows.
awk -v s="$shared_a" -v p="$pages_a" 'BEGIN { exit !(s >= 0.98 * p) }' || fail "a: $shared_a of $pages_a pages shared"
[ "$shared_b" = 0 ] || fail "b: $shared_b shared pages, no process of b forked"
a_pages=$(echo "$procs" | grep -o '{[^{}]*"cgroup":"/zblk-attrib-a"[^{}]*}' | sed 's/.*"pages":\([0-9]*\).*/\1/' | tr '\n' ' ')
full=$(for p in $a_pages; do echo "$p"; done | awk -v a="$pages_a" '{ d = $1 - a; if (d < 0) d = -d; if (d <= 0.02 * a) n++ } END { print n + 0 }')
[ "$full" = 2 ] || fail "a: $full process rows hold a's $pages_a pages (rows: $a_pages), 2 expected"
# The pid of c's usemem (one process: --procs 1 runs in-process).
cpid=$(cat "$CGC/cgroup.procs")
[ "$(echo "$cpid" | wc -l)" = 1 ] && grep -q usemem "/proc/$cpid/comm" ||
    fail "c holds $(echo "$cpid" | tr '\n' ' '), not one usemem"
# The swap entries of process $1's mappings (all but [vsyscall], past
# what shell arithmetic holds), "TYPE OFFSET" a line, from its pagemap:
# bit 62 swapped (63 present clear), bits 0-4 the type, 5-54 the offset
# (bit 55, soft-dirty, masked off).
swap_entries() {
    grep -v vsyscall "/proc/$1/maps" | while IFS='- ' read -r lo hi _; do
        dd if="/proc/$1/pagemap" bs=8 skip=$((0x$lo / 4096)) count=$(((0x$hi - 0x$lo) / 4096)) 2>/dev/null
    done | od -An -v -t x8 | awk '
        function hex(s,   i, v) { v = 0; for (i = 1; i <= length(s); i++) v = v * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1; return v }
        # (busybox awk may lack ^ and %: int() and products only)
        # (od prints two entries a line)
        { for (f = 1; f <= NF; f++) { h = hex(substr($f, 1, 1)); if (h < 4 || h >= 8) continue
          d = hex(substr($f, 3, 1)); if (d >= 8) d -= 8
          v = d * 4503599627370496 + hex(substr($f, 4)); o = int(v / 32); print v - o * 32, o } }'
}
swap_entries "$cpid" >/tmp/zblk-vm.entries-c
dump=$(zblk dump -n "$ZID" --json) || fail "zblk dump failed"
rc=$(row pid "$cpid" "$procs")
[ -n "$rc" ] || fail "no row for c's usemem $cpid ($(grep VmSwap "/proc/$cpid/status"), $(wc -l </tmp/zblk-vm.entries-c) entries in its pagemap, c's swap $(swap_of "$CGC")); rows: $(echo "$procs" | grep -o '"pid":[0-9]*,"name":"[^"]*","cgroup":"[^"]*"' | tr '\n' ' ' | cut -c1-500) scan: $(echo "$procs" | grep -o '"scan":{[^}]*}')"
types=$(cut -d' ' -f1 /tmp/zblk-vm.entries-c | sort -u | tr '\n' ' ')
n_c=$(wc -l </tmp/zblk-vm.entries-c)
[ "$(echo "$types" | wc -w)" -le 1 ] || fail "c's usemem has pages on swap types $types"
# The sizes the dump gives c's offsets (dump lines first, then offsets).
dump_c=$( (echo "$dump" | sed -n 's/.*"index":\([0-9]*\),"kind":"[a-z_]*","size":\([0-9]*\).*/D \1 \2/p'; sed 's/^[0-9]* /O /' /tmp/zblk-vm.entries-c) |
    awk '$1 == "D" { size[$2] = $3; next } ($2 in size) { n++; s += size[$2] } END { print n + 0, s + 0 }')
log "c's usemem $cpid: $n_c swap entries (types $types), dump: ${dump_c% *} stored in ${dump_c#* } bytes; zblk: $(echo "$rc" | jnum pages) pages in $(echo "$rc" | jnum compr_bytes)"
[ "$n_c" -gt 0 ] && [ "$(echo "$rc" | jnum pages)" = "$n_c" ] && [ "${dump_c% *}" = "$n_c" ] ||
    fail "c's usemem: pagemap says $n_c swapped pages, the dump stores ${dump_c% *}, zblk counts $(echo "$rc" | jnum pages)"
[ "$(echo "$rc" | jnum compr_bytes)" = "${dump_c#* }" ] ||
    fail "c's usemem: zblk says $(echo "$rc" | jnum compr_bytes) compressed bytes, the dump ${dump_c#* }"

# No shmem here: what no process maps (the unattributed row) is the swap
# header and the swap cache's pages, at most 2 % of what the device stores.
un=$(row unattributed true "$flat" | jnum pages)
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

# Only a's pages go to the backing device.
wb=$(zblk writeback -n "$ZID" --cgroup /zblk-attrib-a 2>&1) || fail "writeback --cgroup failed: $wb"
written=$(echo "$wb" | tr ' ' '\n' | grep -A1 -x written | tail -1)
log "writeback --cgroup /zblk-attrib-a: $wb"
awk -v w="$written" -v p="$pages_a" 'BEGIN { exit !(w <= p && w >= 0.98 * p) }' ||
    fail "writeback --cgroup wrote $written of a's $pages_a pages"
j=$(zblk stat --by cgroup -n "$ZID" --json 2>&1) || fail "zblk stat --by cgroup failed: $j"
after=$(echo "$j" | tr -d '\n ')
back_a=$(row cgroup '"/zblk-attrib-a"' "$after" | jnum written_back_pages)
back_b=$(row cgroup '"/zblk-attrib-b"' "$after" | jnum written_back_pages)
back_c=$(row cgroup '"/zblk-attrib-c"' "$after" | jnum written_back_pages)
bd_count=$(zstat_store bd_count)
[ "$back_a" = "$written" ] && [ "$back_b" = 0 ] && [ "$back_c" = 0 ] && [ "$bd_count" = "$written" ] ||
    fail "after writeback --cgroup a: written back a $back_a b $back_b c $back_c, bd_count $bd_count, written $written"

touch "$GO"
for p in $pa $pb $pc; do
    wait "$p" || fail "usemem $p failed: $(tail -c 300 /tmp/zblk-vm.usemem-a /tmp/zblk-vm.usemem-b /tmp/zblk-vm.usemem-c)"
done
must zblk del -n "$ZID" --force >/dev/null
loop_backing_release
rmdir "$CGA" "$CGB" "$CGC" 2>/dev/null
pass "pages_a_b=$sum_pages shared_a=$shared_a stored=$stored unattributed=$un c=$n_c written_a=$written $scan"
