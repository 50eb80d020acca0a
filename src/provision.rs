//! The thread that keeps the allocator's memory reserve filled (see
//! `slab::reserve`): started by a store whose configuration asks for a
//! reserve, stopped when the store goes.

use crate::alloc::ObjAllocator;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Bytes the provisioner's malloc arena is grown by before it starts: the
/// owner tables and list room it allocates come from there.
const ARENA_ROOM: usize = 1 << 20;

/// The provisioner's scheduling: `SCHED_FIFO` 1 unless this variable is
/// `normal`. The page allocator lets a real-time task's allocations dip
/// halfway into the min watermark's reserve (`ALLOC_MIN_RESERVE`), the
/// reserve kernel reclaimers get, so the provisioner can still refill the
/// spares when free memory is below the min watermark, where a task at
/// normal priority would wait in reclaim and the queue threads, finding
/// no spare, would refuse writes (BENCHMARKS.md, "The whole machine at
/// 1.5x RAM", has the figures). It is one thread that sleeps between passes
/// and faults pages in; the kernel's real-time throttling
/// (`sched_rt_runtime_us`) bounds it if it ever spun, and without that
/// throttling it stays at normal priority.
const SCHED_ENV: &str = "ZBLK_RESERVE_SCHED";

/// An experiment's switch: `ZBLK_RESERVE_NOIO=1` leaves the provisioner an
/// I/O flusher like the daemon's other threads (see [`allow_io_in_reclaim`]),
/// for an A/B.
const NOIO_ENV: &str = "ZBLK_RESERVE_NOIO";

/// Lets the provisioner's own reclaim write pages out, and reach the OOM
/// killer, when the process is an I/O flusher (`PR_SET_IO_FLUSHER`, which
/// the daemon sets before any thread exists, so that every thread has it).
///
/// A queue thread must never wait on I/O that it would serve itself; the
/// provisioner serves none, and as an I/O flusher its page faults are
/// `GFP_NOIO`. Below the min watermark (half of it, at `SCHED_FIFO`) such a
/// fault's reclaim can swap nothing out, and the page allocator never calls
/// the OOM killer for an allocation without `__GFP_FS`: it retries it for
/// as long as it takes (`out_of_memory`: "The OOM killer does not
/// compensate for IO-less reclaim"), a real-time thread in a loop while the
/// queue thread pinned to that CPU runs only in what real-time throttling
/// leaves. Without the flag, its reclaim swaps pages out as any task's does
/// (through the queue threads, which wait for the provisioner at most
/// `MISS_WAITS` x `MISS_WAIT` and never for its reclaim), and when nothing
/// can be reclaimed the OOM killer frees memory (the daemon's
/// `oom_score_adj` of -1000 keeps the daemon out of its choice). Clearing
/// the flag needs `CAP_SYS_RESOURCE`, which a daemon that has a keeper
/// keeps; without it the provisioner stays an I/O flusher, said in the log.
fn allow_io_in_reclaim() {
    const PR_SET_IO_FLUSHER: libc::c_int = 57;
    const PR_GET_IO_FLUSHER: libc::c_int = 58;
    if std::env::var(NOIO_ENV).is_ok_and(|v| v == "1") {
        log::info!("memory reserve: provisioner left an I/O flusher ({NOIO_ENV}=1)");
        return;
    }
    // SAFETY: prctl with integer arguments has no memory effects.
    let flusher = unsafe { libc::prctl(PR_GET_IO_FLUSHER, 0, 0, 0, 0) };
    if flusher < 0 {
        let e = std::io::Error::last_os_error();
        // EINVAL: a kernel before 5.6, which has no I/O flushers.
        if e.raw_os_error() != Some(libc::EINVAL) {
            log::info!("memory reserve: provisioner keeps the process's I/O-flusher setting ({e})");
        }
        return;
    }
    if flusher == 0 {
        return;
    }
    // SAFETY: as above; this clears the flags of the calling thread alone.
    if unsafe { libc::prctl(PR_SET_IO_FLUSHER, 0, 0, 0, 0) } == 0 {
        log::info!("memory reserve: provisioner reclaims with I/O (not an I/O flusher)");
    } else {
        log::warn!(
            "memory reserve: provisioner stays an I/O flusher ({}): below the min \
             watermark its faults wait for kswapd and never for the OOM killer",
            std::io::Error::last_os_error()
        );
    }
}

/// Whether the provisioner asks for `SCHED_FIFO` (see [`SCHED_ENV`]): not
/// when told `normal`, nor where the kernel's real-time throttling is off
/// (`sched_rt_runtime_us` -1), since nothing would then bound a real-time
/// thread that spun.
fn wants_realtime() -> bool {
    if std::env::var(SCHED_ENV).is_ok_and(|v| v == "normal") {
        return false;
    }
    let unthrottled = std::fs::read_to_string("/proc/sys/kernel/sched_rt_runtime_us")
        .is_ok_and(|v| v.trim() == "-1");
    if unthrottled {
        log::warn!(
            "memory reserve: real-time throttling is off (sched_rt_runtime_us -1), \
             provisioner at normal priority"
        );
    }
    !unthrottled
}

/// Makes the calling thread `SCHED_FIFO` 1 if allowed (`CAP_SYS_NICE` or
/// `RLIMIT_RTPRIO` >= 1, which the daemon raises before it drops its
/// capabilities); logged either way.
fn realtime() {
    let p = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler reads `p`, a valid sched_param; pid 0 is
    // the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } == 0 {
        log::info!("memory reserve: provisioner runs SCHED_FIFO 1");
    } else {
        log::warn!(
            "memory reserve: SCHED_FIFO refused ({}), provisioner at normal priority: \
             under memory pressure its spares may run dry (raise RLIMIT_RTPRIO to 1)",
            std::io::Error::last_os_error()
        );
    }
}

/// The provisioner thread of one store.
pub(crate) struct Provisioner {
    alloc: Arc<dyn ObjAllocator>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Provisioner {
    /// Starts the thread; `None` (logged) if it cannot be started, in which
    /// case allocations the reserve cannot serve fail once their waits run
    /// out.
    pub(crate) fn start(alloc: Arc<dyn ObjAllocator>) -> Option<Provisioner> {
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (alloc.clone(), stop.clone());
        match std::thread::Builder::new()
            .name("zblk-reserve".into())
            .spawn(move || {
                // Its page faults are to be the spares' alone, off every
                // lock (see `crate::page::prefault_thread`).
                crate::page::prefault_thread(ARENA_ROOM);
                allow_io_in_reclaim();
                if wants_realtime() {
                    realtime();
                }
                a.serve_reserve(&s)
            }) {
            Ok(t) => Some(Provisioner {
                alloc,
                stop,
                thread: Some(t),
            }),
            Err(e) => {
                log::error!("cannot start the memory reserve's provisioner: {e}");
                None
            }
        }
    }

    /// Stops the thread and waits for it.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Relaxed);
        self.alloc.wake_reserve();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!("the memory reserve's provisioner panicked");
            }
        }
    }
}

impl Drop for Provisioner {
    fn drop(&mut self) {
        self.stop();
    }
}
