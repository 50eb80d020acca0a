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
