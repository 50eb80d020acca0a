# recompress: zram's idle marking and recompression on a live swap device.
# usemem writes 2 x 192 MB through a 1 GB lz4 zblk swap device under a
# memory cgroup and holds it until the scenario is done with the held
# pages; once every process has written and stored pages are steady, `zblk
# idle --all` marks every stored page idle, `zblk set --recompress-algos
# "none zstd:3"` gives the device a list of two whose first never fits
# (none stores nothing smaller), and `zblk recompress --type idle` stores
# the pages again with the second. Pass: stat shows the list (the store's
# and the policy's), idle and recompressed pages, the data and (after the compaction
# the recompression ends with) the device's memory dropped, and
# usemem then reads every page back intact (the reads decode the secondary
# algorithm) with no kernel swap error; the reads clear the idle marks.
#
# In run.sh's default list (about 40 s under TCG); alone:
#   bash tests/vm/run.sh --scenario recompress
SCEN=recompress
DMESG_FROM=$(( $(dmesg | wc -l) + 1 ))
zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --swap
CG=$(cg_make "$SCEN" "$ZBLK_LIMIT_MB")
MARK=/tmp/zblk-vm.recompress.mark GO=/tmp/zblk-vm.recompress.go
rm -f "$MARK" "$GO"
in_cg usemem --mb "$ZBLK_USEMEM_MB" --procs "$ZBLK_USEMEM_PROCS" --mark "$MARK" --hold-file "$GO" >/tmp/zblk-vm.usemem 2>&1 &
U=$!
track $U
# The hold: usemem holds its pages until $GO exists, so no swap-in or
# swap-out runs while the pages are marked, recompressed and measured.
# Stored pages stop growing once every process has written its pages.
last=-1 i=0
while [ $i -lt 600 ]; do
    sleep 0.5
    st=$(zstat | jnum stored_pages)
    written=$(grep -c written "$MARK" 2>/dev/null)
    [ "${written:-0}" -ge "$ZBLK_USEMEM_PROCS" ] && [ "$st" -gt 20000 ] && [ "$st" = "$last" ] && break
    last=$st i=$((i + 1))
done
[ "$st" -gt 20000 ] || fail "only $st pages stored before the hold"
j0=$(zstat)
mem0=$(echo "$j0" | jnum mem_used_total) compr0=$(echo "$j0" | jnum compr_data_size)
must zblk idle -n "$ZID" --all >/dev/null
idle=$(zstat | jnum idle_pages)
[ "$idle" -gt 0 ] && [ "$idle" -le "$st" ] || fail "after idle --all: idle_pages=$idle with $st stored"
must zblk set -n "$ZID" --recompress-algos "none zstd:3" >/dev/null
out=$(zblk recompress -n "$ZID" --type idle 2>&1) || fail "recompress failed: $out"
j1=$(zstat)
plist=$(zstat_policy recompress_algo)
[ "$plist" = "none zstd:3" ] || fail "the policy's recompress_algo is '$plist'"
rec=$(echo "$j1" | jnum recompressed_pages) saved=$(echo "$j1" | jnum recompress_saved_bytes)
mem1=$(echo "$j1" | jnum mem_used_total) compr1=$(echo "$j1" | jnum compr_data_size)
[ "$rec" -gt 0 ] || fail "nothing recompressed: $out"
[ "$(echo "$j1" | jget recompress_algorithm)" = "none zstd:3" ] || fail "recompress_algorithm is '$(echo "$j1" | jget recompress_algorithm)'"
st1=$(echo "$j1" | jnum stored_pages)
orig0=$(echo "$j0" | jnum orig_data_size) orig1=$(echo "$j1" | jnum orig_data_size)
[ "$compr1" -lt "$compr0" ] || fail "compr_data_size did not drop: $compr0 -> $compr1 (stored $st -> $st1, orig $orig0 -> $orig1, idle $idle, recompressed $rec: $out)"
# The recompression compacts after itself: the memory drops with the data.
[ "$mem1" -lt "$mem0" ] || fail "mem_used_total did not drop: $mem0 -> $mem1 ($out)"
touch "$GO"
log "stored=$st idle=$idle recompressed=$rec saved=$saved compr $compr0 -> $compr1 mem $mem0 -> $mem1 ($out)"
wait $U
urc=$?
uj=$(grep '"program":"usemem"' /tmp/zblk-vm.usemem | tail -1)
[ "$urc" = 0 ] || fail "usemem exit $urc after the recompression: $(tail -c 400 /tmp/zblk-vm.usemem | tr '\n' ' ')"
[ "$(echo "$uj" | jget ok)" = true ] && [ "$(echo "$uj" | jnum bad_pages)" = 0 ] || fail "usemem: $uj"
dmesg | tail -n +"$DMESG_FROM" | grep -qiE 'segfault|SIGBUS|I/O error, dev ublkb|(read|write)-error on swap' &&
    fail "kernel saw errors: $(dmesg | tail -n +"$DMESG_FROM" | grep -iE 'I/O error|-error on swap' | tail -2 | tr '\n' '|')"
rmdir "$CG" 2>/dev/null
must zblk del -n "$ZID" --force >/dev/null
pass "stored=$st idle=$idle recompressed=$rec (lz4 -> none, zstd:3) compr_data_size $compr0 -> $compr1 ($(ratio "$compr1" "$compr0")x) mem_used_total $mem0 -> $mem1 ($(ratio "$mem1" "$mem0")x); usemem then verified every page"
