# stat: zblk list and zblk stat (table and JSON) while the pressure program
# runs; fields present and consistent.
zadd --size "${ZBLK_DEV_MB}M" --algo "$ZBLK_ALGO" --swap
CG=$(cg_make stat "$ZBLK_LIMIT_MB")
in_cg usemem --mb "$ZBLK_USEMEM_MB" --procs "$ZBLK_USEMEM_PROCS" --sleep 3 >/tmp/zblk-vm.usemem 2>&1 &
upid=$!
track $upid
samples=0 busy=0
FIELDS="orig_data_size compr_data_size mem_used_total mem_limit mem_used_max same_pages pages_compacted huge_pages failed_reads failed_writes invalid_io notify_free stored_pages deferred_free_pending"
while kill -0 $upid 2>/dev/null; do
    t=$(zblk list 2>&1) || fail "zblk list failed: $t"
    echo "$t" | grep -q NAME || fail "zblk list has no header: $t"
    echo "$t" | grep -q "ublkb$ZID" || fail "zblk list does not show ublkb$ZID: $t"
    j=$(zblk list --json 2>&1) || fail "zblk list --json failed: $j"
    echo "$j" | grep -q "ublkb$ZID" || fail "zblk list --json does not show ublkb$ZID: $j"
    t=$(zblk stat -n "$ZID" 2>&1) || fail "zblk stat failed: $t"
    echo "$t" | grep -q stored_pages || fail "zblk stat table lacks stored_pages: $(echo "$t" | head -5)"
    j=$(zstat) || fail "zblk stat --json failed"
    for f in $FIELDS; do
        [ -n "$(echo "$j" | jget $f)" ] || fail "zblk stat --json lacks $f"
    done
    for op in write read discard; do
        echo "$j" | tr -d '\n ' | grep -q "\"$op\":{[^}]*\"p99" || fail "zblk stat --json lacks $op latency percentiles"
    done
    orig=$(echo "$j" | jnum orig_data_size); compr=$(echo "$j" | jnum compr_data_size)
    mem=$(echo "$j" | jnum mem_used_total); sp=$(echo "$j" | jnum stored_pages); same=$(echo "$j" | jnum same_pages)
    [ "$orig" -ge "$compr" ] || fail "orig_data_size $orig < compr_data_size $compr"
    if [ "$sp" -gt "$same" ]; then
        busy=$((busy + 1))
        [ "$mem" -gt 0 ] || fail "mem_used_total is 0 with $sp stored pages"
        [ "$compr" -gt 0 ] || fail "compr_data_size is 0 with $sp stored pages"
    fi
    [ "$sp" -ge "$same" ] || fail "stored_pages $sp < same_pages $same"
    samples=$((samples + 1))
    sleep 0.5
done
wait $upid || fail "usemem failed: $(tail -c 300 /tmp/zblk-vm.usemem)"
[ "$busy" -gt 0 ] || fail "no sample saw stored pages in $samples samples"
log "last sample: $(echo "$j" | tr -d '\n' | cut -c1-400)"
pass "samples=$samples with_data=$busy last: stored_pages=$sp orig=$orig compr=$compr mem_used_total=$mem"
