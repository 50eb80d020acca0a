#!/usr/bin/env python3
"""Asks a silent guest where it is: SysRq through qemu's monitor.

tests/vm/run.sh starts this beside qemu when ZBLK_VM_MONITOR=1 and
ZBLK_VM_SYSRQ_SILENCE=SECS are set. Whenever the console log has not grown
for SECS seconds, it sends SysRq 9 (console loglevel), t (every task),
w (blocked tasks), l (every CPU's backtrace) and m (memory) through the
monitor socket, and again every 5 minutes while the silence lasts (stuck or slow?): the guest
prints them on its console, so they land in console.log beside the
scenario's last words. A guest stuck in reclaim often cannot run its own
watchdog (in such a stall even `sleep 1` can make no progress), which is
why this is done from the host.

Usage: vm-sysrq-watch.py CONSOLE_LOG MONITOR_SOCKET SECS QEMU_PID
It ends when process QEMU_PID does (run.sh passes its own pid and stops it
after qemu).
"""

import os
import socket
import sys
import time

# 9 first: the console loglevel (4 in the suite) would print only the
# dumps' headers.
KEYS = ("9", "t", "w", "l", "m")
ECHO_S = 60
REPEAT_S = 300


def alive(pid: int) -> bool:
    """Whether process pid still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sysrq(sock_path: str, keys) -> None:
    """Sends alt-sysrq-KEY for each key through the monitor at sock_path."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(sock_path)
        for k in keys:
            s.sendall(f"sendkey alt-sysrq-{k}\n".encode())
            # The guest prints each dump before the next key is useful.
            time.sleep(2)


def size(path: str) -> int:
    """The size of path, 0 when it is not there yet."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def main() -> int:
    if len(sys.argv) != 5:
        print("usage: vm-sysrq-watch.py CONSOLE_LOG MONITOR_SOCKET SECS QEMU_PID", file=sys.stderr)
        return 2
    log, sock_path, secs, pid = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    last, since = size(log), time.monotonic()
    # When the last dump went out (None: none for this silence). A dump's
    # own lines grow the log, so output within ECHO_S of it does not count
    # as the guest speaking again; a silence that goes on gets a fresh dump
    # every REPEAT_S, to tell stuck from slow.
    sent = None
    while alive(pid):
        time.sleep(1)
        now, now_size = time.monotonic(), size(log)
        if now_size != last:
            last, since = now_size, now
            if sent is not None and now - sent >= ECHO_S:
                sent = None
            continue
        due = sent is None and now - since >= secs
        if due or (sent is not None and now - sent >= REPEAT_S):
            print(f"vm-sysrq-watch: console silent {now - since:.0f} s: SysRq {' '.join(KEYS)}", file=sys.stderr)
            try:
                sysrq(sock_path, KEYS)
            except OSError as e:
                print(f"vm-sysrq-watch: monitor {sock_path}: {e}", file=sys.stderr)
            sent = time.monotonic()
    return 0


if __name__ == "__main__":
    sys.exit(main())
