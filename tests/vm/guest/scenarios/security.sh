# security: a non-root user gets one clear refusal from every zblk command
# that talks to a device, and changes nothing: first with the sockets as
# zblk makes them (root's, in a 0700 /run/zblk), then with their modes
# opened on purpose, so that only the daemon's and the keeper's own peer
# check (SO_PEERCRED) stands in the way. The daemon and its keeper keep
# exactly the capabilities docs/daemon.md documents, on every thread, with
# no_new_privs set.

grep -q '^nobody:x:65534:' /etc/passwd || fail "no user nobody (65534) in the guest's /etc/passwd"
# Runs the command line $1 as nobody (busybox su: root needs no password).
as_nobody() { su -s /bin/sh nobody -c "$1"; }
[ "$(as_nobody 'id -u' 2>&1)" = 65534 ] || fail "su to nobody does not work: $(as_nobody 'id -u' 2>&1)"

# Expects zblk $1, run as nobody, to fail with one line saying why ($2: a
# pattern of that line; any permission wording by default).
REFUSED=0
refused() {
    out=$(as_nobody "zblk $1" 2>&1) && fail "as nobody, 'zblk $1' succeeded: $(echo "$out" | head -2 | tr '\n' '|')"
    [ "$(echo "$out" | grep -c .)" = 1 ] || fail "as nobody, 'zblk $1' did not fail in one line: $(echo "$out" | tr '\n' '|')"
    echo "$out" | grep -qiE "${2:-permission denied|needs root|run as root}" ||
        fail "as nobody, 'zblk $1' failed unclearly: $out"
    REFUSED=$((REFUSED + 1))
    log "refused: zblk $1 -> $out"
}

# Field $2 of /proc/$1/status.
status_of() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
# Checks that every thread of process $1 ($2: what it is) has exactly the
# capabilities $3 (hex, as /proc shows them), no inheritable or ambient
# ones, and no_new_privs.
check_caps() {
    local t n=0
    for t in /proc/"$1"/task/*; do
        for f in CapEff CapPrm CapBnd; do
            v=$(awk -v k="$f:" '$1 == k { print $2 }' "$t/status")
            [ "$v" = "$3" ] || fail "$2 pid $1 thread ${t##*/}: $f $v, want $3"
        done
        for f in CapInh CapAmb; do
            v=$(awk -v k="$f:" '$1 == k { print $2 }' "$t/status")
            [ "$v" = 0000000000000000 ] || fail "$2 pid $1 thread ${t##*/}: $f $v, want none"
        done
        [ "$(awk '$1 == "NoNewPrivs:" { print $2 }' "$t/status")" = 1 ] || fail "$2 pid $1 thread ${t##*/}: no_new_privs not set"
        n=$((n + 1))
    done
    log "$2 pid $1: $n threads, CapEff=$3, no_new_privs"
}

# CAP_SYS_ADMIN (21) | CAP_IPC_LOCK (14) | CAP_SYS_RESOURCE (24) |
# CAP_SETPCAP (8): the keeper starts daemons, which harden themselves and
# drop their bounding set (ublk-target/src/privileges.rs).
KEEPER_CAPS=0000000001204100
# The same for a daemon with a keeper: it starts a new keeper if its own
# dies.
DAEMON_CAPS=0000000001204100
# A daemon without a keeper (--no-recovery) starts nothing: CAP_SYS_ADMIN |
# CAP_IPC_LOCK.
PLAIN_CAPS=0000000000204000

zadd --size 64M --algo "$ZBLK_ALGO"
dd if=/dev/urandom of=/tmp/zblk-vm.src bs=1048576 count=4 2>/dev/null
dd if=/tmp/zblk-vm.src of="$ZDEV" bs=1048576 count=4 oflag=direct conv=notrunc 2>/dev/null || fail "write to $ZDEV failed"
dpid=$(zdaemon_pid "$ZID") || fail "no process holds /dev/ublkc$ZID"
kpid=$(zkeeper_pid "$ZID") || fail "no keeper process for device $ZID"
check_caps "$dpid" daemon "$DAEMON_CAPS"
check_caps "$kpid" keeper "$KEEPER_CAPS"

# Every command, as zblk leaves the sockets.
for c in "list" "list --json" "stat" "stat -n $ZID" "stat -n $ZID --json" \
    "stat -n $ZID --format prometheus" "stat --format prometheus" \
    "set -n $ZID --mem-limit 1M" "idle -n $ZID --all" "recompress -n $ZID --algo zstd:9" \
    "compact -n $ZID" "restart -n $ZID" "recover -n $ZID" "del -n $ZID" \
    "del -n $ZID --force" "del --all --force" "add --size 64M" "top --iterations 1"; do
    refused "$c"
done
closed=$REFUSED

# The same with the directory and both sockets opened to everyone: the
# daemon and the keeper refuse the peer themselves.
chmod 0755 /run/zblk
chmod 0666 "/run/zblk/$ZID.sock" "/run/zblk/$ZID.keeper.sock"
PEER="answers root only \(you are uid 65534\)"
for c in "stat -n $ZID" "stat -n $ZID --json" "set -n $ZID --mem-limit 1M" \
    "idle -n $ZID --all" "recompress -n $ZID --algo zstd:9" "compact -n $ZID" \
    "restart -n $ZID" "recover -n $ZID" "del -n $ZID" "del -n $ZID --force"; do
    refused "$c" "$PEER"
done
# list reports each device's refusal on stderr and lists none.
out=$(as_nobody "zblk list" 2>&1)
echo "$out" | grep -qE "$PEER" || fail "as nobody, zblk list on an open socket: $out"
echo "$out" | grep -q "^/dev/ublkb$ZID " && fail "as nobody, zblk list showed the device: $out"
chmod 0700 /run/zblk
chmod 0600 "/run/zblk/$ZID.sock" "/run/zblk/$ZID.keeper.sock"

# Nothing changed: the same daemon and keeper, no limit, no idle mark, the
# data intact, the device live.
[ "$(zdaemon_pid "$ZID")" = "$dpid" ] || fail "the daemon changed (was $dpid)"
[ "$(zkeeper_pid "$ZID")" = "$kpid" ] || fail "the keeper changed (was $kpid)"
j=$(zstat) || fail "zblk stat as root failed"
[ "$(echo "$j" | jnum mem_limit)" = 0 ] || fail "mem_limit changed: $(echo "$j" | jnum mem_limit)"
[ "$(echo "$j" | jnum idle_pages)" = 0 ] || fail "idle_pages changed: $(echo "$j" | jnum idle_pages)"
[ "$(echo "$j" | jnum recompressed_pages)" = 0 ] || fail "pages were recompressed"
dd if="$ZDEV" of=/tmp/zblk-vm.back bs=1048576 count=4 iflag=direct 2>/dev/null || fail "read of $ZDEV failed"
cmp -s /tmp/zblk-vm.src /tmp/zblk-vm.back || fail "data of $ZDEV differs after the refused commands"
zblk list | grep -E "^/dev/ublkb$ZID " | grep -q live || fail "device $ZID not live: $(zblk list | tr '\n' '|')"
must zblk del -n "$ZID"

# A daemon with no keeper keeps less.
zadd --size 64M --algo "$ZBLK_ALGO" --no-recovery
dpid=$(zdaemon_pid "$ZID") || fail "no process holds /dev/ublkc$ZID"
check_caps "$dpid" "daemon (no recovery)" "$PLAIN_CAPS"
must zblk del -n "$ZID"
pass "$closed commands refused as nobody with root's sockets, $((REFUSED - closed)) more by the peer check on opened sockets, nothing changed (4 MB verified); capabilities: daemon $DAEMON_CAPS, keeper $KEEPER_CAPS, no-recovery daemon $PLAIN_CAPS, no_new_privs"
