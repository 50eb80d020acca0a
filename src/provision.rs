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
            .spawn(move || a.serve_reserve(&s))
        {
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
