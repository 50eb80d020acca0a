//! The thread that keeps the allocator's memory reserve filled (see
//! `slab::reserve`): started by a store whose configuration asks for a
//! reserve, stopped when the store goes.

use crate::alloc::ObjAllocator;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

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
                realtime();
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

/// Makes the calling thread `SCHED_FIFO` at priority 1, if allowed (root,
/// `CAP_SYS_NICE`, or `RLIMIT_RTPRIO` >= 1, which the daemon sets): the
/// page allocator lets a real-time task's allocations dip halfway into the
/// `min` watermark's reserve (`ALLOC_MIN_RESERVE`), below where the
/// workloads that fill memory must wait, much as it lets the kernel's own
/// reclaimers (and so zram's zsmalloc) dip into it. The provisioner mostly
/// sleeps, so it takes little CPU from anyone.
fn realtime() {
    let p = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler reads `p`, a valid sched_param; pid 0 is
    // the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } == 0 {
        log::info!("memory reserve: provisioner runs SCHED_FIFO 1");
    } else {
        log::info!(
            "memory reserve: provisioner at normal priority ({})",
            std::io::Error::last_os_error()
        );
    }
}

impl Drop for Provisioner {
    fn drop(&mut self) {
        self.stop();
    }
}
