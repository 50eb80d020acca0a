//! What the server of a swap device needs so that serving a write never
//! waits for swap to make room (which would wait on this very server).

use crate::error::{Error, Result, Step};
use std::io::Write;

/// `prctl(PR_SET_IO_FLUSHER)` (Linux 5.6): allocations of this thread never
/// recurse into I/O and it is not throttled for dirty pages. Threads created
/// afterwards inherit it.
pub fn set_io_flusher() -> Result<()> {
    const PR_SET_IO_FLUSHER: libc::c_int = 57;
    // SAFETY: prctl with integer arguments has no memory effects.
    let r = unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) };
    if r != 0 {
        return Err(Error::last_os(Step::IoFlusher));
    }
    Ok(())
}

/// `mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT)`: nothing the daemon
/// maps, now or later (engine memory, stacks, I/O buffers), can be swapped
/// out onto the device the daemon serves. `MCL_ONFAULT` locks pages as they
/// are touched rather than populating whole mappings up front: the slab
/// reserves address space in growing chunks, and populating them at map
/// time would pin up to twice the memory really in use.
pub fn lock_memory() -> Result<()> {
    // SAFETY: mlockall has no memory-safety preconditions.
    let r = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) };
    if r != 0 {
        return Err(Error::last_os(Step::LockMemory));
    }
    Ok(())
}

/// Locks, and so faults in, every page of the program and its shared
/// libraries: `lock_memory`'s `MCL_ONFAULT` locks a page only once touched,
/// so code the daemon had not run yet stays evictable, and where the
/// program lives in shared memory (an initramfs or a tmpfs root, as in the
/// VM suite's guest) evicting it means swapping it out, possibly onto the
/// device this daemon serves: the queue thread that first runs that code
/// then waits for a swap-in only it could serve. Locked, every page of
/// code a queue thread may run is resident before the first request. On
/// a disk it would mean a read from the disk in the middle of a swap
/// write. About the program's size (6 MB) stays locked. Returns the
/// bytes locked; a mapping that cannot be locked is logged and skipped.
pub fn lock_program() -> u64 {
    let maps = match std::fs::read_to_string("/proc/self/maps") {
        Ok(m) => m,
        Err(e) => {
            log::warn!("/proc/self/maps: {e}; the program's code is locked only as it runs");
            return 0;
        }
    };
    let mut locked = 0;
    for (start, len) in program_ranges(&maps) {
        // SAFETY: mlock only changes how the kernel treats pages of a
        // mapping this process has; it reads or writes no memory itself.
        if unsafe { libc::mlock(start as *const libc::c_void, len) } == 0 {
            locked += len as u64;
        } else {
            log::warn!(
                "mlock of the program's {len} bytes at {start:#x}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    locked
}

/// The accessible file-backed mappings of `/proc/self/maps` text (start,
/// length): the program and its libraries, not the store's memfd
/// (`/memfd:...`), a device's mapping or a deleted file's.
pub fn program_ranges(maps: &str) -> Vec<(usize, usize)> {
    maps.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, perms) = (f.next()?, f.next()?);
            let path = f.nth(3)?;
            let file = path.starts_with('/')
                && !path.starts_with("/memfd:")
                && !path.starts_with("/dev/")
                && !line.ends_with("(deleted)");
            if !file || perms.starts_with("---") {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            let a = usize::from_str_radix(a, 16).ok()?;
            let b = usize::from_str_radix(b, 16).ok()?;
            (b > a).then(|| (a, b - a))
        })
        .collect()
}

/// `oom_score_adj = -1000`: the OOM killer never picks the daemon (killing
/// it would lose every page swapped to it).
pub fn protect_from_oom() -> Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/oom_score_adj")
        .and_then(|mut f| f.write_all(b"-1000"))
        .map_err(Error::os(Step::OomScore))
}

/// Keeps the heap's memory once faulted in: glibc's malloc otherwise gives
/// the top of a heap back to the OS once more than 128 KB of it is free,
/// and serves blocks over a (moving) threshold with an mmap of their own,
/// unmapped on free; either way the next allocation faults in fresh pages.
/// Whatever a queue thread allocates and frees while it serves (a library's
/// scratch buffer, a vector grown for a request) would then come back as
/// fresh pages, so under memory pressure a queue thread would fault, enter
/// direct reclaim and wait on the swap writes it is there to complete.
/// With trimming off and the mmap threshold at its maximum, the
/// heap keeps (locked, by `lock_memory`) what it once used, and those
/// allocations reuse it. Logged and ignored where malloc is not glibc's.
pub fn keep_heap() {
    #[cfg(target_env = "gnu")]
    {
        /// glibc's largest mmap threshold on 64-bit (HEAP_MAX_SIZE / 2).
        const MMAP_THRESHOLD_MAX: libc::c_int = 32 << 20;
        // SAFETY: mallopt only changes malloc's tunables.
        let ok = unsafe {
            libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX) == 1
                && libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1
        };
        if !ok {
            log::warn!("mallopt refused; the heap may give memory back and fault it in again");
        }
    }
}

/// `RLIMIT_RTPRIO` of at least 1, so that the memory reserve's provisioner
/// thread may make itself `SCHED_FIFO` 1 after the daemon dropped
/// `CAP_SYS_NICE` (zblk's `provision`: a real-time task's allocations may
/// dip into the page allocator's reserve, where the spares ran dry).
/// Logged, not fatal: the provisioner then stays at normal priority.
pub fn allow_realtime() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the plain local `r`.
    let ok = unsafe {
        libc::getrlimit(libc::RLIMIT_RTPRIO, &mut r) == 0 && {
            r.rlim_cur = r.rlim_cur.max(1);
            r.rlim_max = r.rlim_max.max(r.rlim_cur);
            libc::setrlimit(libc::RLIMIT_RTPRIO, &r) == 0
        }
    };
    if !ok {
        log::warn!(
            "RLIMIT_RTPRIO: {}; the memory reserve's provisioner stays at normal priority",
            std::io::Error::last_os_error()
        );
    }
}

/// All of the above, in the order that makes each effective.
pub fn harden() -> Result<()> {
    set_io_flusher()?;
    protect_from_oom()?;
    keep_heap();
    allow_realtime();
    lock_memory()?;
    log::info!("program locked: {} bytes", lock_program());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::program_ranges;

    #[test]
    fn program_ranges_are_the_files_mapped_not_memfds_devices_or_holes() {
        let maps = "\
559a00000000-559a00001000 r--p 00000000 08:01 1234   /usr/bin/zblk
559a00001000-559a00600000 r-xp 00001000 08:01 1234   /usr/bin/zblk
559a00600000-559a00601000 ---p 00600000 08:01 1234   /usr/bin/zblk
559a00601000-559a00602000 rw-p 00601000 08:01 1234   /usr/bin/zblk
559a01000000-559a01100000 rw-p 00000000 00:00 0      [heap]
7f0000000000-7f4000000000 rw-s 00000000 00:01 77     /memfd:zblk-store (deleted)
7f5000000000-7f5000010000 rw-s 00000000 00:05 88     /dev/ublkc0
7f6000000000-7f6000001000 r--p 00000000 08:01 99     /tmp/gone (deleted)
7f7000000000-7f7000200000 r-xp 00000000 08:01 4321   /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0      [stack]
";
        assert_eq!(
            program_ranges(maps),
            vec![
                (0x559a00000000, 0x1000),
                (0x559a00001000, 0x5ff000),
                (0x559a00601000, 0x1000),
                (0x7f7000000000, 0x200000),
            ]
        );
        assert!(program_ranges("garbage\n\n1-0 r-xp 0 0 1 /x\n").is_empty());
    }

    #[test]
    fn this_program_is_found_in_its_own_maps() {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let exe = std::fs::read_link("/proc/self/exe").expect("exe");
        let ranges = program_ranges(&maps);
        let code = maps
            .lines()
            .filter(|l| l.contains(" r-xp ") && l.ends_with(exe.to_str().unwrap_or("?")))
            .count();
        assert!(code >= 1, "no code mapping of {exe:?} in maps");
        assert!(ranges.len() >= code);
    }
}
