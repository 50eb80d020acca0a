#!/bin/sh
# The checks of tests/vm/systemd/run.sh, in the Debian guest, run by
# zblk-vmtest.service once the system is up. The phase comes from the
# kernel command line (zblk.phase=install|check). Each group of checks
# runs in a subshell and prints one PASS or FAIL line (lib.sh's pass and
# fail); "END <phase>" tells the host the phase ran to its end.
L=/usr/local/lib/zblk-vm
. $L/lib.sh systemd
PHASE=$(tr ' ' '\n' </proc/cmdline | sed -n 's/^zblk\.phase=//p')
# The workload's cgroup needs the memory controller below the root.
echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
ZID=0
ZDEV=/dev/ublkb0
# The filesystem of the [ublkb1] section, and the mount unit zblk-generator
# writes for it (systemd-escape --path).
FSMNT=/mnt/zblk-scratch
FSUNIT='mnt-zblk\x2dscratch.mount'

# The swap priority of $1 in /proc/swaps (empty: not swap).
swap_prio() { awk -v d="$1" '$1 == d { print $5 }' /proc/swaps; }
# A property of a unit (systemctl show).
prop() { systemctl show -p "$2" --value "$1"; }
# Waits up to $2 seconds for command "$1" (a shell string) to succeed.
wait_until() {
    local i=0
    until sh -c "$1"; do
        [ $i -ge $(($2 * 10)) ] && return 1
        sleep 0.1; i=$((i + 1))
    done
}
# Swap on ublkb0 at priority 100, its daemon answering; $1 says after what.
check_swap_up() {
    wait_until "grep -q '^/dev/ublkb0 ' /proc/swaps" 30 || fail "$1: no swap on /dev/ublkb0: $(cat /proc/swaps | tr '\n' '|')"
    [ "$(swap_prio /dev/ublkb0)" = 100 ] || fail "$1: swap priority $(swap_prio /dev/ublkb0), want 100"
    zstat >/dev/null || fail "$1: zblk stat -n 0 does not answer"
}
check_gone() {
    wait_until "! grep -q '^/dev/ublkb0 ' /proc/swaps && [ ! -e /dev/ublkb0 ]" 60 ||
        fail "$1: /dev/ublkb0 still there: $(cat /proc/swaps | tr '\n' '|')"
    ! zblk list --noheadings 2>/dev/null | grep -q '^/dev/ublkb0 ' || fail "$1: zblk list still shows $(zblk list --noheadings)"
    [ ! -e /run/zblk/0.keeper.sock ] || fail "$1: the keeper's socket is left behind"
}

phase_install() (
    SCEN=systemd-install
    must dpkg -i $L/zblk.deb >/dev/null
    [ -x /usr/bin/zblk ] || fail "no /usr/bin/zblk after dpkg -i"
    [ -f /usr/share/man/man1/zblk.1.gz ] || fail "no man page zblk(1)"
    [ -f /usr/share/bash-completion/completions/zblk ] || fail "no bash completion"
    systemctl cat zblk-setup.service zblk@.service >/dev/null || fail "the units are not installed"
    cat >/etc/zblk/zblk.conf <<CONF
# written by tests/vm/systemd/guest.sh
[ublkb0]
size = "min(ram / 2, 1024)"
compression-algorithm = "lz4"

[ublkb1]
size = 256
mount-point = "$FSMNT"

# Skipped: this machine has more than 1 MB of memory.
[ublkb2]
size = 64
host-memory-limit = 1
CONF
    zblk setup --dry-run | grep -q 'would create /dev/ublkb0' || fail "setup --dry-run: $(zblk setup --dry-run 2>&1)"
    zblk setup --dry-run | grep -q "mkfs.ext4 .* /dev/ublkb1, then mount -t ext4 -o discard /dev/ublkb1 $FSMNT" ||
        fail "setup --dry-run shows no mkfs and mount of ublkb1: $(zblk setup --dry-run 2>&1 | tr '\n' '|')"
    [ -x /usr/lib/systemd/system-generators/zblk-generator ] || fail "no zblk-generator"
    must systemctl enable zblk-setup.service >/dev/null
    pass "package $(dpkg-query -W -f='${Version}' zblk) installed, zblk-setup.service enabled"
)

# Swap came up at boot; discard works (an exiting workload's pages leave);
# stop, start and restart of zblk-setup.service.
phase_boot() (
    SCEN=systemd-boot
    [ "$(prop zblk-setup.service ActiveState)" = active ] || fail "zblk-setup.service is $(prop zblk-setup.service ActiveState): $(journalctl -b -u zblk-setup -n 5 --no-pager | tr '\n' '|')"
    check_swap_up "at boot"
    swap_workload zblk
    # With discard, what the workload freed leaves the device, but for the
    # pages of swap clusters still partly in use (6.12 kept 0.6-2.2 %;
    # without discard all of them would stay; munmap_workload allows 5 % too).
    left=$((256 + W_PEAK / 20))
    wait_until "[ \$(zblk stat -n 0 --json | tr -d '\n' | grep -o '\"stored_pages\"[^,]*' | head -1 | tr -dc 0-9) -lt $left ]" 20 ||
        fail "pages stayed on the device after the workload exited (discard off?): $(zstat | jnum stored_pages) stored of $W_PEAK at the peak"
    pass "swap at boot, priority 100, $W_FIGS, $(zstat | jnum stored_pages) pages left after exit (discard)"
)

phase_setup_unit() (
    SCEN=systemd-setup-unit
    pid0=$(zdaemon_pid 0)
    must systemctl stop zblk-setup.service
    check_gone "after systemctl stop"
    # Its zblk del --all left the mounted filesystem of [ublkb1] alone.
    grep -q "^/dev/ublkb1 $FSMNT " /proc/mounts || fail "systemctl stop zblk-setup.service took $FSMNT away"
    must systemctl start zblk-setup.service
    check_swap_up "after systemctl start"
    pid1=$(zdaemon_pid 0)
    must systemctl restart zblk-setup.service
    check_swap_up "after systemctl restart"
    pid2=$(zdaemon_pid 0)
    [ -n "$pid2" ] && [ "$pid2" != "$pid1" ] || fail "restart kept daemon pid $pid1"
    # A unit whose section is skipped: ready without a device, and its
    # ExecStop (run when the main process exits) says nothing and succeeds.
    U2=zblk@2.service
    must systemctl start $U2
    wait_until "[ \"\$(systemctl show -p ActiveState --value $U2)\" = inactive ]" 10 || fail "$U2 is $(prop $U2 ActiveState) after a skipped start"
    j=$(journalctl -b -u $U2 -o cat --no-pager)
    [ "$(prop $U2 Result)" = success ] && [ ! -e /dev/ublkb2 ] && echo "$j" | grep -q "no /dev/ublkb2: .*host-memory-limit = 1" &&
        ! echo "$j" | grep -q "left to the restart" || fail "$U2: result $(prop $U2 Result), log: $(echo "$j" | tr '\n' '|')"
    pass "stop: swap off, device gone; start and restart: swap back (daemons $pid0 $pid1 $pid2); $U2 skipped, its stop quiet"
)

# zblk@0.service: the store in systemd's fd store; kill -9 of the daemon
# under a verifying workload, three times; a handover (zblk restart).
phase_fdstore() (
    SCEN=systemd-fdstore
    U0=zblk@0.service
    must systemctl stop zblk-setup.service
    check_gone "before zblk@0"
    must systemctl start $U0
    [ "$(prop $U0 ActiveState)" = active ] || fail "$U0 is $(prop $U0 ActiveState)"
    check_swap_up "zblk@0 started"
    [ "$(prop $U0 NFileDescriptorStore)" = 1 ] || fail "the unit's fd store holds $(prop $U0 NFileDescriptorStore) fds, want 1"
    zblk list --json | grep -q '"recovery": *"reissue"' || fail "zblk@0 has no recovery: $(zblk list --json | tr -d '\n' | cut -c1-300)"
    dmesg_mark
    BASE=$(zstat | jnum mem_used_total)
    CG=$(cg_make "$SCEN" "$ZBLK_LIMIT_MB")
    in_cg usemem --mb "$ZBLK_USEMEM_MB" --procs "$ZBLK_USEMEM_PROCS" --sleep 1 --passes 6 >/tmp/zblk-vm.usemem 2>&1 &
    U=$!
    track $U
    wait_until "[ \$(zblk stat -n 0 --json | tr -d '\n' | grep -o '\"stored_pages\"[^,]*' | head -1 | tr -dc 0-9) -ge 4096 ]" 60 ||
        fail "the workload never reached swap"
    PEAK=0 ms=""
    for k in 1 2 3; do
        old=$(prop $U0 MainPID)
        t0=$(now)
        kill -9 "$old"
        wait_until "[ \"\$(systemctl show -p NRestarts --value $U0)\" = $k ] && [ \"\$(systemctl show -p MainPID --value $U0)\" != $old ] && zblk stat -n 0 --json >/dev/null 2>&1" 30 ||
            fail "kill $k: no new daemon serves (unit $(prop $U0 ActiveState)/$(prop $U0 SubState), NRestarts $(prop $U0 NRestarts)): $(journalctl -b -u $U0 -n 6 --no-pager | tr '\n' '|')"
        ms="$ms $(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%d", (b - a) * 1000 }')"
        n=$(zstat | jnum stored_pages); [ "$n" -gt "$PEAK" ] && PEAK=$n
        sleep 3
    done
    # (not $out: lib.sh's must() sets that)
    old=$(prop $U0 MainPID)
    handed=$(zblk restart -n 0 2>&1) || fail "zblk restart -n 0: $handed"
    [ "$(prop $U0 ActiveState)" = active ] && [ "$(prop $U0 MainPID)" != "$old" ] && [ "$(prop $U0 NRestarts)" = 4 ] ||
        fail "after zblk restart: $U0 $(prop $U0 ActiveState), MainPID $(prop $U0 MainPID) (was $old), NRestarts $(prop $U0 NRestarts)"
    usemem_verified "after 3 kills and a restart"
    REC=$(zstat | jnum recoveries)
    [ "$REC" = 4 ] || fail "stat shows recoveries=$REC after 3 kills and a restart"
    rmdir "$CG" 2>/dev/null
    wait_mem_back 0 "$BASE" "$PEAK" 200
    must systemctl stop $U0
    check_gone "after systemctl stop $U0"
    [ "$(prop $U0 NFileDescriptorStore)" = 0 ] || fail "the fd store still holds $(prop $U0 NFileDescriptorStore) fds after stop"
    pass "3 kills + 1 zblk restart under usemem, kill-to-serving ms:$ms, $(echo "$UJ" | jget total_mb) MB verified x6 passes, peak $PEAK pages, recoveries $REC, memory back to baseline, $handed"
)

# The filesystem of [ublkb1]: mounted at boot by the generator's mount unit
# (before local-fs.target), ext4 with discard; a file on it survives kill -9
# of zblk@1's daemon (the fd store); systemctl stop zblk@1 unmounts, then
# deletes the device; starting the mount unit brings both back.
phase_mount() (
    SCEN=systemd-mount
    U1=zblk@1.service
    [ "$(prop "$FSUNIT" ActiveState)" = active ] || fail "$FSUNIT is $(prop "$FSUNIT" ActiveState): $(journalctl -b -u "$FSUNIT" -u $U1 -n 8 --no-pager | tr '\n' '|')"
    m=$(awk -v p="$FSMNT" '$2 == p { print $1, $3, $4 }' /proc/mounts)
    case "$m" in "/dev/ublkb1 ext4 "*discard*) ;; *) fail "at boot $FSMNT is '$m', want /dev/ublkb1 ext4 with discard";; esac
    t_mnt=$(prop "$FSUNIT" ActiveEnterTimestampMonotonic) t_fs=$(prop local-fs.target ActiveEnterTimestampMonotonic)
    [ "$t_mnt" -gt 0 ] && [ "$t_mnt" -le "$t_fs" ] || fail "$FSMNT mounted at $t_mnt us, local-fs.target reached at $t_fs us"
    [ "$(prop $U1 NFileDescriptorStore)" = 1 ] || fail "$U1's fd store holds $(prop $U1 NFileDescriptorStore) fds, want 1"
    l=$(zblk list -o NAME,MOUNTPOINT --noheadings | tr -s ' ' | tr '\n' '|')
    [ "$l" = "/dev/ublkb0 [SWAP]|/dev/ublkb1 $FSMNT|" ] || fail "zblk list -o NAME,MOUNTPOINT: '$l'"
    head -c 8388608 /dev/urandom >/tmp/zblk-vm.fsfile
    must cp /tmp/zblk-vm.fsfile "$FSMNT/file"
    sync
    mounted_at=$(prop "$FSUNIT" ActiveEnterTimestampMonotonic)
    old=$(prop $U1 MainPID)
    kill -9 "$old"
    wait_until "[ \"\$(systemctl show -p NRestarts --value $U1)\" = 1 ] && [ \"\$(systemctl show -p MainPID --value $U1)\" != $old ] && zblk stat -n 1 --json >/dev/null 2>&1" 30 ||
        fail "kill: no new daemon serves ublkb1: $(journalctl -b -u $U1 -n 6 --no-pager | tr '\n' '|')"
    echo 3 >/proc/sys/vm/drop_caches
    cmp -s /tmp/zblk-vm.fsfile "$FSMNT/file" || fail "the file differs after kill -9 of zblk@1's daemon"
    [ "$(zstat 1 | jnum recoveries)" = 1 ] || fail "ublkb1 recoveries=$(zstat 1 | jnum recoveries) after one kill"
    [ "$(prop "$FSUNIT" ActiveEnterTimestampMonotonic)" = "$mounted_at" ] || fail "$FSUNIT was restarted with its daemon"
    must systemctl stop $U1
    ! grep -q "^/dev/ublkb1 " /proc/mounts || fail "$FSMNT still mounted after systemctl stop $U1"
    wait_until "[ ! -e /dev/ublkb1 ]" 30 || fail "/dev/ublkb1 still there after systemctl stop $U1"
    must systemctl start "$FSUNIT"
    [ "$(prop $U1 ActiveState)" = active ] && grep -q "^/dev/ublkb1 $FSMNT ext4 " /proc/mounts ||
        fail "systemctl start $FSUNIT: $U1 $(prop $U1 ActiveState), mounts: $(grep ublkb /proc/mounts | tr '\n' '|')"
    [ ! -e "$FSMNT/file" ] || fail "the new filesystem has the old file"
    pass "zblk list: MOUNTPOINT $FSMNT; $FSMNT: /dev/ublkb1 ext4 (discard) mounted before local-fs.target ($t_mnt <= $t_fs us); 8 MB file identical after kill -9 of zblk@1's daemon, the mount kept; stop unmounted and deleted it; start made a new one"
)

# Kills what a failed group left running (its workload would make the
# shutdown's swapoff crawl under the cgroup's memory.high).
cleanup() { [ -f /tmp/zblk-vm.pids ] && kill -9 $(cat /tmp/zblk-vm.pids) 2>/dev/null; rm -f /tmp/zblk-vm.pids; }
# systemctl poweroff/reboot (a shutdown that hangs is the host's timeout).
leave() { sync; systemctl "$1"; }

case "$PHASE" in
install)
    phase_install
    echo "END install"
    leave reboot
    ;;
check)
    phase_boot; cleanup
    phase_mount; cleanup
    phase_setup_unit; cleanup
    phase_fdstore; cleanup
    echo "END check"
    leave poweroff
    ;;
*)
    echo "FAIL systemd no zblk.phase= on the kernel command line"
    systemctl poweroff
    ;;
esac
