# transport-ab: UBLK_F_BATCH_IO against the classic one-command-per-request
# transport, A/B in one boot (crate::transport in ublk-target). Each round
# runs, on a device of each transport (order alternating by round), the
# swap workload of zram-compare and randio's random 4 KB reads at queue
# depth 1 and writes at depth 8 on the raw device. The result line carries
# the median of each batch/classic ratio over ZBLK_AB_ROUNDS (default 3).
# Every device first checks that it got the transport it asked for.
#
# On a driver without BATCH_IO (6.12) it checks that `--transport batch`
# is refused with a clear message and that auto gives classic, and passes.
#
# Not in run.sh's default list (about 3-4 min under TCG on 7.3); run it with:
#   bash tests/vm/run.sh --kernel 7.3 --scenario transport-ab
SCEN=transport-ab
: "${ZBLK_AB_ROUNDS:=3}" "${ZBLK_AB_RANDIO_S:=4}"

# A device of transport $1 (plus add flags), checked to have it.
tadd() {
    local t=$1
    shift
    zadd --algo "$ZBLK_ALGO" --transport "$t" "$@"
    got=$(zstat | jget transport_in_use)
    [ "$got" = "$t" ] || fail "asked for transport $t, the device uses '$got'"
}

zadd --size 64M --algo "$ZBLK_ALGO" --transport auto
if ! grep -q '"BATCH_IO"' /tmp/zblk-vm.add; then
    [ "$(zstat | jget transport_in_use)" = classic ] || fail "auto without BATCH_IO gave '$(zstat | jget transport_in_use)'"
    must zblk del -n "$ZID" >/dev/null
    out=$(zblk add --size 64M --transport batch 2>&1) && fail "--transport batch accepted without BATCH_IO: $out"
    echo "$out" | grep -q "BATCH_IO" || fail "--transport batch refused without naming BATCH_IO: $out"
    pass "driver lacks BATCH_IO: auto gave classic, batch refused: $out"
fi
[ "$(zstat | jget transport_in_use)" = batch ] || fail "auto with BATCH_IO gave '$(zstat | jget transport_in_use)'"
must zblk del -n "$ZID" >/dev/null

# Figures of one transport: swap, then randio on a raw device.
one() {
    local t=$1 r
    tadd "$t" --size "${ZBLK_DEV_MB}M" --swap
    swap_workload "$t"
    F=$W_FIGS
    must zblk del -n "$ZID" --force >/dev/null
    tadd "$t" --size 128M
    randio --dev "$ZDEV" --mb 64 --prefill --write-pct 0 --jobs 1 --seconds "$ZBLK_AB_RANDIO_S" >/tmp/zblk-vm.randio 2>&1 ||
        fail "$t: randio reads failed: $(tail -c 300 /tmp/zblk-vm.randio)"
    r=$(grep '"program":"randio"' /tmp/zblk-vm.randio | tail -1)
    F="$F qd1_read_iops=$(echo "$r" | jget iops) qd1_read_p50_us=$(echo "$r" | jget p50_us)"
    randio --dev "$ZDEV" --mb 64 --write-pct 100 --jobs 8 --seconds "$ZBLK_AB_RANDIO_S" >/tmp/zblk-vm.randio 2>&1 ||
        fail "$t: randio writes failed: $(tail -c 300 /tmp/zblk-vm.randio)"
    r=$(grep '"program":"randio"' /tmp/zblk-vm.randio | tail -1)
    F="$F qd8_write_iops=$(echo "$r" | jget iops)"
    must zblk del -n "$ZID" >/dev/null
}

keys="wall_s write_mb_s verify_mb_s qd1_read_iops qd1_read_p50_us qd8_write_iops"
for k in $keys; do eval "all_$k=''"; done
round=1
while [ "$round" -le "$ZBLK_AB_ROUNDS" ]; do
    if [ $((round % 2)) = 1 ]; then
        one classic; AB_C=$F; one batch; AB_B=$F
    else
        one batch; AB_B=$F; one classic; AB_C=$F
    fi
    line="round $round batch/classic:"
    for k in $keys; do
        x=$(ratio "$(get "$AB_B" "$k")" "$(get "$AB_C" "$k")")
        line="$line $k=$x"
        eval "all_$k=\"\$all_$k $x\""
    done
    log "$line | classic: $AB_C | batch: $AB_B"
    round=$((round + 1))
done
res="rounds=$ZBLK_AB_ROUNDS batch/classic medians:"
for k in $keys; do eval "res=\"\$res $k=\$(echo \"\$all_$k\" | median)\""; done

# A batch device survives `zblk restart` under swap (it hands over without
# quiesce, see crate::transport) and a kill -9, every page verified.
handover_start 4 --transport batch
sleep 2
out=$(zblk restart -n "$ZID" 2>&1) || fail "batch: restart: $out"
sleep 2
pid=$(zdaemon_pid "$ZID") || fail "batch: no daemon after the restart"
taken=$(takeovers "/run/zblk/$ZID.log")
kill -9 "$pid"
wait_takeover "/run/zblk/$ZID.log" "$taken" 300 || fail "batch: no new daemon within 30 s of the kill"
handover_finish 2 "handovers (a restart and a kill)"
[ "$(zstat | jget transport_in_use)" = batch ] || fail "batch: the recovered device uses '$(zstat | jget transport_in_use)'"
pass "$res | batch device: restart + kill -9 under swap, usemem verified every page"
