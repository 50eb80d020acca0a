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
/// The codecs allocate and free scratch memory on every call (lz4_flex an
/// 8 KB hash table per page), so under memory pressure a queue thread would
/// fault, enter direct reclaim and wait on the swap writes it is there to
/// complete. With trimming off and the mmap threshold at its maximum, the
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
    lock_memory()
}
