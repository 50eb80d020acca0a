#!/usr/bin/env python3
"""Holds MB megabytes of anonymous memory pushed out to swap.

Maps MB megabytes, fills each page with a random 1,400 bytes (the same
for every page, the page's offset in its first 8) and zeros, pushes the
last OUT megabytes of the mapping (all of it by default) out with
madvise(MADV_PAGEOUT) (Linux 5.4+), prints its VmSwap, then sleeps an
hour; with `fork`, a child sharing every swapped page sleeps too. What
`zblk stat --by` is measured on (BENCHMARKS.md, "Who holds the swap").

Usage: swapped-holder.py MB [OUT] [fork]
"""
import mmap
import os
import sys
import time

MADV_PAGEOUT = 21
PAGE = 4096


def main():
    mb = int(sys.argv[1])
    n = mb << 20
    numbers = [int(a) for a in sys.argv[2:] if a.isdigit()]
    out = min(numbers[0], mb) << 20 if numbers else n
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    page = bytearray(os.urandom(1400)) + bytearray(PAGE - 1400)
    for i in range(0, n, PAGE):
        page[0:8] = i.to_bytes(8, "little")
        m[i:i + PAGE] = page
    step = 64 << 20
    for off in range(n - out, n, step):
        m.madvise(MADV_PAGEOUT, off, min(step, n - off))
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSwap"):
                print(line.strip(), flush=True)
    if "fork" in sys.argv[2:] and os.fork() == 0:
        time.sleep(3600)
        os._exit(0)
    time.sleep(3600)


if __name__ == "__main__":
    main()
