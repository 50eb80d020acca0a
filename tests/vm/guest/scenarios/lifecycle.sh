# lifecycle: del refuses an active swap device without --force and removes it
# with; bad arguments fail with one clear line; --io-threads 2 serves each
# queue with two threads (verified data, and again after zblk restart) where
# the driver has UBLK_F_PER_IO_DAEMON and is refused in one line where not;
# --poll-us serves verified data, before and after zblk restart; kill -9 of
# the daemon under load leaves the guest alive and a new device can be
# added afterwards.

# Expects "$@" to fail with a non-empty message.
refuse() {
    out=$("$@" 2>&1) && fail "'$*' succeeded, expected an error"
    [ -n "$out" ] || fail "'$*' failed without a message"
    log "refused as expected: $* -> $(echo "$out" | head -1)"
}

zadd --size 256M --algo "$ZBLK_ALGO" --swap
is_swap "$ZDEV" || fail "$ZDEV is not in /proc/swaps"
# The driver's features, as the daemon reported them.
per_io=0
grep -q '"PER_IO_DAEMON"' /tmp/zblk-vm.add && per_io=1
refuse zblk del -n "$ZID"
is_swap "$ZDEV" || fail "zblk del without --force took $ZDEV out of swap"
[ -b "$ZDEV" ] || fail "zblk del without --force removed $ZDEV"
# SIGTERM of the daemon of an active swap device is refused: it keeps serving.
pid=$(zdaemon_pid "$ZID") || fail "no process holds /dev/ublkc$ZID"
kill -TERM "$pid"
sleep 2
kill -0 "$pid" 2>/dev/null || fail "SIGTERM stopped the daemon of active swap $ZDEV"
is_swap "$ZDEV" || fail "$ZDEV left swap after SIGTERM"
must zblk del -n "$ZID" --force
is_swap "$ZDEV" && fail "$ZDEV still swap after zblk del --force"
i=0
while [ -b "$ZDEV" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
[ -b "$ZDEV" ] && fail "$ZDEV still exists after zblk del --force"
[ -e "/run/zblk/$ZID.sock" ] && fail "/run/zblk/$ZID.sock left behind after zblk del --force"

# A taken id is refused; SIGTERM stops an idle device cleanly.
zadd --size 64M --id 5
refuse zblk add --size 64M --id 5
pid=$(zdaemon_pid 5) || fail "no process holds /dev/ublkc5"
kill -TERM "$pid"
i=0
while { kill -0 "$pid" 2>/dev/null || [ -b /dev/ublkb5 ] || [ -e /run/zblk/5.sock ]; } && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill -0 "$pid" 2>/dev/null && fail "daemon $pid still runs 10 s after SIGTERM"
[ -b /dev/ublkb5 ] && fail "/dev/ublkb5 still exists after SIGTERM"
[ -e /run/zblk/5.sock ] && fail "/run/zblk/5.sock left behind after SIGTERM"

# --foreground: serves in the CLI process until zblk del.
zblk add --size 64M --id 6 --foreground --json </dev/null >/tmp/zblk-vm.fg 2>&1 &
fg=$!
track $fg
i=0
while [ ! -b /dev/ublkb6 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -b /dev/ublkb6 ] || fail "zblk add --foreground: no /dev/ublkb6 after 10 s: $(tail -3 /tmp/zblk-vm.fg)"
must zblk del -n 6 >/dev/null
i=0
while kill -0 $fg 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill -0 $fg 2>/dev/null && fail "zblk add --foreground still runs 10 s after zblk del"
wait $fg || fail "zblk add --foreground exited $? after zblk del"

# --io-threads 2: parallel writers reach both threads of a queue (the
# per-queue counters are per I/O thread, thread t at index q * 2 + t); the
# data reads back, and again after zblk restart and after a kill -9, whose
# new daemons serve the device with two threads too.
if [ "$per_io" = 1 ]; then
    t0=$(date +%s)
    refuse zblk add --size 64M --io-threads 2 --transport batch
    zadd --size 64M --algo "$ZBLK_ALGO" --io-threads 2 --queue-cpus any
    t_id=$ZID t_dev=$ZDEV
    [ "$(zstat | jget io_threads)" = 2 ] || fail "--io-threads 2: stat says io_threads '$(zstat | jget io_threads)'"
    dd if=/dev/urandom of=/tmp/zblk-vm.iot bs=1048576 count=16 2>/dev/null
    ws=""
    for k in 0 1 2 3; do
        dd if=/tmp/zblk-vm.iot of="$t_dev" bs=65536 skip=$((k * 64)) seek=$((k * 64)) count=64 oflag=direct conv=notrunc 2>/dev/null &
        ws="$ws $!"
    done
    for w in $ws; do wait "$w" || fail "--io-threads 2: a write to $t_dev failed"; done
    per_thread=$(queue_field pages_written | awk '{ s[(NR - 1) % 2] += $1 } END { print s[0] + 0, s[1] + 0 }')
    log "--io-threads 2: pages written by threads 0 and 1 of the queues: $per_thread"
    case "$per_thread" in 0\ * | *\ 0) fail "--io-threads 2: a thread served no write ($per_thread)" ;; esac
    dd if="$t_dev" of=/tmp/zblk-vm.iot.back bs=1048576 count=16 iflag=direct 2>/dev/null || fail "read of $t_dev failed"
    cmp -s /tmp/zblk-vm.iot /tmp/zblk-vm.iot.back || fail "--io-threads 2: data read back from $t_dev differs"
    must zblk restart -n "$t_id" >/dev/null
    [ "$(zstat | jget io_threads)" = 2 ] || fail "--io-threads 2: after zblk restart stat says io_threads '$(zstat | jget io_threads)'"
    dd if="$t_dev" of=/tmp/zblk-vm.iot.back bs=1048576 count=16 iflag=direct 2>/dev/null || fail "read of $t_dev after zblk restart failed"
    cmp -s /tmp/zblk-vm.iot /tmp/zblk-vm.iot.back || fail "--io-threads 2: data of $t_dev differs after zblk restart"
    # A crash: the keeper's new daemon serves it with two threads again.
    LOG=/run/zblk/$t_id.log
    taken=$(takeovers "$LOG")
    pid=$(zdaemon_pid "$t_id") || fail "no process holds /dev/ublkc$t_id"
    kill -9 "$pid"
    wait_takeover "$LOG" "$taken" 300 || fail "--io-threads 2: no take-over 30 s after kill -9: $(tail -2 "$LOG" | tr '\n' '|')"
    [ "$(zstat | jget io_threads)" = 2 ] || fail "--io-threads 2: after the crash stat says io_threads '$(zstat | jget io_threads)'"
    dd if="$t_dev" of=/tmp/zblk-vm.iot.back bs=1048576 count=16 iflag=direct 2>/dev/null || fail "read of $t_dev after the crash failed"
    cmp -s /tmp/zblk-vm.iot /tmp/zblk-vm.iot.back || fail "--io-threads 2: data of $t_dev differs after the crash"
    must zblk del -n "$t_id"
    log "--io-threads 2 checks took $(($(date +%s) - t0)) s"
    iot="--io-threads 2 served by both threads, 16 MB verified before and after zblk restart and a kill -9"
else
    out=$(zblk add --size 64M --io-threads 2 2>&1) && fail "--io-threads 2 accepted without PER_IO_DAEMON: $out"
    echo "$out" | grep -q PER_IO_DAEMON || fail "--io-threads 2 refused without naming PER_IO_DAEMON: $out"
    log "driver lacks PER_IO_DAEMON: --io-threads 2 refused: $out"
    iot="--io-threads 2 refused without PER_IO_DAEMON"
fi

# --poll-us: queue threads that busy-poll on the other CPUs serve the
# device, the data reads back, and the window survives zblk restart.
zadd --size 64M --algo "$ZBLK_ALGO" --queue-cpus other --poll-us 200
[ "$(zstat | jget poll_us)" = 200 ] || fail "--poll-us 200: stat says poll_us '$(zstat | jget poll_us)'"
dd if=/dev/urandom of=/tmp/zblk-vm.poll bs=1048576 count=8 2>/dev/null
dd if=/tmp/zblk-vm.poll of="$ZDEV" bs=4096 count=2048 oflag=direct conv=notrunc 2>/dev/null || fail "--poll-us: write to $ZDEV failed"
must zblk restart -n "$ZID" >/dev/null
[ "$(zstat | jget poll_us)" = 200 ] || fail "--poll-us 200: after zblk restart stat says poll_us '$(zstat | jget poll_us)'"
dd if="$ZDEV" of=/tmp/zblk-vm.poll.back bs=4096 count=2048 iflag=direct 2>/dev/null || fail "--poll-us: read of $ZDEV failed"
cmp -s /tmp/zblk-vm.poll /tmp/zblk-vm.poll.back || fail "--poll-us: data read back from $ZDEV differs"
must zblk del -n "$ZID" >/dev/null
rm -f /tmp/zblk-vm.poll /tmp/zblk-vm.poll.back
refuse zblk add --size 64M --poll-us 20000

refuse zblk add --size 0
refuse zblk add --size 1000
refuse zblk add --size 64M --algo no-such-algo
refuse zblk del -n 97
refuse zblk stat -n 97 --json
refuse zblk frobnicate

# kill -9 under load: writers and readers on the device, then the daemon dies.
# --no-recovery: this is the device that dies with its daemon (recovery,
# the default, is the crash scenario's).
zadd --size 256M --algo "$ZBLK_ALGO" --no-recovery
old=$ZID olddev=$ZDEV
pid=$(zdaemon_pid "$ZID") || fail "no process holds /dev/ublkc$ZID"
dd if=/dev/urandom of=/tmp/zblk-vm.src bs=1048576 count=16 2>/dev/null
( while :; do dd if=/tmp/zblk-vm.src of="$ZDEV" bs=1048576 oflag=direct conv=notrunc 2>/dev/null || exit 0; done ) >/dev/null 2>&1 &
w=$!; track $w
( while :; do dd if="$ZDEV" of=/dev/null bs=1048576 count=64 iflag=direct 2>/dev/null || exit 0; done ) >/dev/null 2>&1 &
r=$!; track $r
sleep 2
kill -9 "$pid"
log "killed daemon $pid under load"
# The loaders see I/O errors and stop; hanging for good would be the bug.
i=0
while { kill -0 $w 2>/dev/null || kill -0 $r 2>/dev/null; } && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 $w 2>/dev/null || kill -0 $r 2>/dev/null; then
    fail "I/O on $olddev still blocked 30 s after the daemon was killed"
fi
# Reads now fail fast (or the disk is gone) instead of hanging.
if [ -b "$olddev" ]; then
    timeout 20 dd if="$olddev" of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null
    rc=$?
    [ "$rc" = 137 ] || [ "$rc" = 143 ] && fail "a read of $olddev hangs after the daemon died"
fi
load_s=$((i / 10))
zblk del -n "$old" --force >/tmp/zblk-vm.del 2>&1
log "zblk del -n $old --force after the kill: exit $? $(head -1 /tmp/zblk-vm.del)"
for n in /dev/ublkb$old /dev/ublkc$old; do [ -e "$n" ] && log "note: $n is still there after the daemon died"; done
log "after kill: $(zblk list 2>&1 | tr '\n' '|')"
zadd --size 64M --algo "$ZBLK_ALGO"
dd if=/tmp/zblk-vm.src of="$ZDEV" bs=1048576 count=4 oflag=direct conv=notrunc 2>/dev/null || fail "write to the new $ZDEV failed"
dd if="$ZDEV" of=/tmp/zblk-vm.back bs=1048576 count=4 iflag=direct 2>/dev/null || fail "read of the new $ZDEV failed"
head -c 4194304 /tmp/zblk-vm.src | cmp -s - /tmp/zblk-vm.back || fail "data read back from the new $ZDEV differs"
must zblk del -n "$ZID"

# No binary to restart from (a package upgrade replacing it, say): the
# keeper cannot start a daemon after the kill, the device shows `quiesced`
# (the driver holds its I/O), and `zblk recover` once the binary is back
# brings it live with its pages intact.
zadd --size 64M --algo "$ZBLK_ALGO"
q_id=$ZID q_dev=$ZDEV
dd if=/tmp/zblk-vm.src of="$q_dev" bs=1048576 count=4 oflag=direct conv=notrunc 2>/dev/null || fail "write to $q_dev failed"
ZB=$(command -v zblk)
pid=$(zdaemon_pid "$q_id") || fail "no process holds /dev/ublkc$q_id"
mv "$ZB" /tmp/zblk-vm.bin
kill -9 "$pid"
i=0
while ! /tmp/zblk-vm.bin list 2>/dev/null | grep -E "^/dev/ublkb$q_id " | grep -q quiesced && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
st=$(/tmp/zblk-vm.bin list 2>&1 | grep -E "^/dev/ublkb$q_id " | tr -s ' ')
mv /tmp/zblk-vm.bin "$ZB"
echo "$st" | grep -q quiesced || fail "binary gone: zblk list shows '$st', want quiesced"
must zblk recover -n "$q_id" >/dev/null
i=0
while ! zblk list 2>/dev/null | grep -E "^/dev/ublkb$q_id " | grep -q live && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
zblk list | grep -E "^/dev/ublkb$q_id " | grep -q live || fail "zblk recover: device $q_id not live: $(zblk list | tr '\n' '|')"
dd if="$q_dev" of=/tmp/zblk-vm.back bs=1048576 count=4 iflag=direct 2>/dev/null || fail "read of $q_dev after zblk recover failed"
head -c 4194304 /tmp/zblk-vm.src | cmp -s - /tmp/zblk-vm.back || fail "data of $q_dev differs after zblk recover"
must zblk del -n "$q_id"

# A killed keeper is replaced: the daemon starts a new one and hands it the
# store; then a kill -9 of the daemon is recovered by the new keeper, with
# the data intact.
zadd --size 64M --algo "$ZBLK_ALGO"
r_id=$ZID r_dev=$ZDEV
LOG=/run/zblk/$r_id.log
dd if=/tmp/zblk-vm.src of="$r_dev" bs=1048576 count=4 oflag=direct conv=notrunc 2>/dev/null || fail "write to $r_dev failed"
kpid=$(zkeeper_pid "$r_id") || fail "no keeper for device $r_id"
dpid=$(zdaemon_pid "$r_id") || fail "no process holds /dev/ublkc$r_id"
kill -9 "$kpid"
i=0
while { k2=$(zkeeper_pid "$r_id") || k2=; [ -z "$k2" ] || [ "$k2" = "$kpid" ]; } && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -n "$k2" ] && [ "$k2" != "$kpid" ] || fail "no new keeper 10 s after kill -9 of keeper $kpid: $(tail -2 "$LOG" | tr '\n' '|')"
# The new keeper's socket can be seen before the daemon has handed it the
# store and logged so: wait for the line (the kill below needs the store
# handed over).
i=0
until grep -q "its keeper (pid $kpid) died; started keeper pid $k2 and handed it the store" "$LOG"; do
    [ $i -lt 100 ] || fail "the daemon did not log the keeper's replacement (keeper $k2) within 10 s: $(tail -3 "$LOG" | tr '\n' '|')"
    sleep 0.1; i=$((i + 1))
done
[ "$(zdaemon_pid "$r_id")" = "$dpid" ] || fail "the daemon changed when its keeper died"
zblk list | grep -E "^/dev/ublkb$r_id " | grep -q live || fail "device $r_id not live with the new keeper: $(zblk list | tr '\n' '|')"
taken=$(takeovers "$LOG")
kill -9 "$dpid"
wait_takeover "$LOG" "$taken" 300 || fail "the new keeper $k2 did not recover the daemon within 30 s: $(tail -3 "$LOG" | tr '\n' '|')"
dd if="$r_dev" of=/tmp/zblk-vm.back bs=1048576 count=4 iflag=direct 2>/dev/null || fail "read of $r_dev after the recovery failed"
head -c 4194304 /tmp/zblk-vm.src | cmp -s - /tmp/zblk-vm.back || fail "data of $r_dev differs after the new keeper's recovery"
[ "$(zkeeper_pid "$r_id")" = "$k2" ] || fail "the keeper changed during the recovery (was $k2)"
must zblk del -n "$r_id"
i=0
while kill -0 "$k2" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill -0 "$k2" 2>/dev/null && fail "the new keeper $k2 still runs 10 s after zblk del"
log "keeper $kpid killed: keeper $k2 took over, recovered daemon $dpid's kill, left on del"

# Crash loop: a recovering device whose daemon is killed as soon as each new
# one takes over. The keeper gives up at the 5th crash within 10 s
# (keeper/policy.rs): it says so once, deletes the device, and I/O on it
# fails instead of stalling for good.
zadd --size 64M --algo "$ZBLK_ALGO"
loop_id=$ZID loop_dev=$ZDEV
LOG=/run/zblk/$loop_id.log
dd if=/tmp/zblk-vm.src of="$loop_dev" bs=1048576 count=4 oflag=direct conv=notrunc 2>/dev/null || fail "write to $loop_dev failed"
# Each new daemon is killed as soon as the keeper names it (no /proc scan:
# the kills must come faster than the window); a slow guest may need more
# than 5 kills to fit 5 in 10 s, so up to 20.
k=0
pid=$(zdaemon_pid "$loop_id") || fail "crash loop: no process holds /dev/ublkc$loop_id"
while [ $k -lt 20 ] && ! grep -q 'giving up' "$LOG"; do
    taken=$(takeovers "$LOG")
    kill -9 "$pid" 2>/dev/null && k=$((k + 1))
    i=0
    while [ "$(takeovers "$LOG")" -le "$taken" ] && ! grep -q 'giving up' "$LOG" && [ $i -lt 300 ]; do sleep 0.05; i=$((i + 1)); done
    [ $i -lt 300 ] || fail "crash loop, kill $k: neither a new daemon nor giving up within 15 s: $(tail -2 "$LOG" | tr '\n' '|')"
    pid=$(grep 'took over in' "$LOG" | tail -1 | sed 's/.*daemon pid \([0-9]*\) took over.*/\1/')
done
i=0
while ! grep -q 'giving up' "$LOG" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
grep -q 'giving up' "$LOG" || fail "crash loop: the keeper did not give up after $k kills: $(tail -2 "$LOG" | tr '\n' '|')"
[ $k -ge 5 ] || fail "crash loop: the keeper gave up after only $k kills"
[ "$(grep -c 'giving up' "$LOG")" = 1 ] || fail "crash loop: the keeper said 'giving up' $(grep -c 'giving up' "$LOG") times"
if [ -b "$loop_dev" ]; then
    timeout 20 dd if="$loop_dev" of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null
    rc=$?
    [ "$rc" = 0 ] && fail "crash loop: a read of $loop_dev succeeded after the keeper gave up"
    [ "$rc" = 124 ] && fail "crash loop: a read of $loop_dev hangs after the keeper gave up"
fi
zblk list 2>&1 | grep -E "^/dev/ublkb$loop_id " | grep -q live && fail "crash loop: zblk list still shows device $loop_id live"
zblk del -n "$loop_id" --force >/dev/null 2>&1
pass "del and SIGTERM refused on active swap, del --force removed it; SIGTERM stopped an idle device; taken id refused; --foreground served until del; $iot; --poll-us 200 on other CPUs verified, kept over restart; 7 bad commands refused; kill -9 under load: loaders stopped in ${load_s}s, new device $ZDEV verified; binary gone: quiesced, then zblk recover verified 4 MB; killed keeper replaced, its daemon's kill recovered (4 MB verified); crash loop: the keeper gave up after $k kills and $loop_dev failed I/O"
