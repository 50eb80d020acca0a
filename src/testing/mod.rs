//! Test helpers shared by the engine's unit tests and its integration
//! tests (cargo feature `test-support`): nothing here is shipped.

use crate::alloc::{Handle, Relocate};

#[cfg(feature = "test-support")]
mod store;
#[cfg(feature = "test-support")]
pub use store::{
    debug_as_layout3, debug_as_layout4, debug_as_layout5, debug_corrupt_object, debug_crash,
    debug_flip_object_byte,
};

/// Passes through crash points so far in this process (see
/// `ZBLK_CRASH_AT` in the engine's `crash_point` module).
pub use crate::crash_point::passed as crash_points_passed;

/// Runs a hook of the test's at every crash point this thread passes
/// (see the engine's `crash_point` module): a race made to happen where it can.
pub use crate::crash_point::on_point as on_crash_point;

/// Bytes of header in front of a packed group's blob (`crate::packed`):
/// where a harness that decodes objects itself finds the blob.
pub const PACK_HEADER: usize = crate::packed::PACK_HEADER;

/// Failure points (see the engine's `fail_point` module and
/// docs/fault-injection.md): arm one by name for its Nth pass on this
/// thread, count passes, see whether it fired.
pub mod faults {
    pub use crate::fail_point::{arm, disarm, passes, stall_provisioner, take_fired, POINTS};
}
use std::sync::Mutex;

/// A minimal slot table for exercising an allocator's compaction: one
/// handle per owner (0: none), each behind its own lock, answering
/// [`Relocate`] as the store's slot table does.
#[derive(Debug)]
pub struct OwnerTable(pub Vec<Mutex<Handle>>);

impl OwnerTable {
    /// A table of `owners` empty slots.
    pub fn new(owners: usize) -> Self {
        OwnerTable((0..owners).map(|_| Mutex::new(0)).collect())
    }

    /// The handle owner `owner` holds now (0: none).
    pub fn get(&self, owner: usize) -> Handle {
        *self.0[owner].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes owner `owner` hold `h`; returns what it held.
    pub fn set(&self, owner: usize, h: Handle) -> Handle {
        std::mem::replace(
            &mut *self.0[owner].lock().unwrap_or_else(|e| e.into_inner()),
            h,
        )
    }
}

impl Relocate for OwnerTable {
    fn relocate(&self, owner: u64, old: Handle, mv: &mut dyn FnMut() -> Option<Handle>) -> bool {
        let Some(slot) = self.0.get(owner as usize) else {
            return false;
        };
        let mut g = slot.lock().unwrap_or_else(|e| e.into_inner());
        if *g != old {
            return false;
        }
        match mv() {
            Some(new) => {
                *g = new;
                true
            }
            None => false,
        }
    }
}
