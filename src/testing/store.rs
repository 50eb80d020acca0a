//! Hooks into a [`Store`] for tests: moving its clock, stalling its
//! drain, corrupting its objects, making its shared memory look as an
//! older layout left it, crashing it. None of them is part of a shipped
//! build (cargo feature `test-support`).

use crate::slab::SlabAllocator;
use crate::slot::Kind;
use crate::store::Store;
use std::sync::Arc;

impl Store {
    /// Moves the store's clock `secs` seconds forward, so that tests of
    /// idle marking need not sleep.
    #[doc(hidden)]
    pub fn debug_advance_clock(&self, secs: u64) {
        self.clock.advance(secs);
    }

    /// Tests: moves the memory reserve's free-memory threshold to `bytes`
    /// (`StoreConfig::reserve_free_below`; `u64::MAX`: memory is short
    /// whatever is free), as free memory falling or rising would.
    #[doc(hidden)]
    pub fn debug_set_reserve_free_below(&self, bytes: u64) {
        self.table.allocator().debug_set_free_below(bytes);
    }

    /// Tests: stalls the free drain (`on`) or lets it go; see
    /// `tests/store_drain_stall.rs`.
    #[doc(hidden)]
    pub fn debug_stall_drain(&self, on: bool) {
        self.table.frees().stall(on);
    }

    /// Tests: pauses the compression workers (`on`) before they claim any
    /// group of a job handed to them, or lets them go; false without
    /// workers. See `tests/store_workers.rs`.
    #[doc(hidden)]
    pub fn debug_pause_workers(&self, on: bool) -> bool {
        self.workers.as_ref().map(|w| w.pause(on)).is_some()
    }

    /// Tests: makes the next group a compression worker claims panic,
    /// which ends that worker's thread; false without workers.
    #[doc(hidden)]
    pub fn debug_worker_panic(&self) -> bool {
        self.workers.as_ref().map(|w| w.panic_next()).is_some()
    }

    /// Tests: the compression workers' thread ids (none without workers).
    #[doc(hidden)]
    pub fn debug_worker_tids(&self) -> Vec<i32> {
        self.workers.as_ref().map_or_else(Vec::new, |w| w.tids())
    }

    /// Tests: compression workers parked idle now (0 without workers).
    #[doc(hidden)]
    pub fn debug_idle_workers(&self) -> usize {
        self.workers.as_ref().map_or(0, |w| w.idle())
    }
}

/// Overwrites the bytes of the object behind `page`, from offset `at` to
/// its end, with `byte`, as a bit flip in RAM would: for tests of how
/// corrupt objects are handled. Returns false when the page has no object
/// or `at` is past its end.
///
/// # Safety
/// No other thread uses the store meanwhile: the object is published, and
/// readers of other slots of its packed group would see the bytes change.
#[doc(hidden)]
pub unsafe fn debug_corrupt_object(store: &Store, page: u64, at: usize, byte: u8) -> bool {
    // SAFETY: `p` points at `n` bytes of the object (the helper's
    // contract); the caller's contract covers everyone else.
    unsafe { with_object_bytes(store, page, at, |p, n| std::ptr::write_bytes(p, byte, n)) }
}

/// XORs the byte at offset `at` of the object behind `page` (a packed
/// object's header included) with `mask`: one precise flip, for tests.
/// Returns false when the page has no object or `at` is past its end.
///
/// # Safety
/// As [`debug_corrupt_object`].
#[doc(hidden)]
pub unsafe fn debug_flip_object_byte(store: &Store, page: u64, at: usize, mask: u8) -> bool {
    // SAFETY: `p` points at a byte of the object (the helper's contract).
    unsafe { with_object_bytes(store, page, at, |p, _| *p ^= mask) }
}

/// Runs `f` with a pointer to byte `at` of the object behind `page` and
/// the bytes from there to its end (a packed object's header counted),
/// under the page's slot lock; false when there is no such byte.
///
/// # Safety
/// As [`debug_corrupt_object`]; `f` touches no byte outside the ones it
/// is given.
unsafe fn with_object_bytes(
    store: &Store,
    page: u64,
    at: usize,
    f: impl FnOnce(*mut u8, usize),
) -> bool {
    if page >= store.table.pages() {
        return false;
    }
    let guard = store.table.lock(page);
    let e = guard.entry();
    let len = e.len as usize
        + if e.kind == Kind::Packed {
            crate::packed::PACK_HEADER
        } else {
            0
        };
    let Some(h) = e.handle().filter(|_| at < len) else {
        return false;
    };
    // SAFETY: the slot lock keeps the object alive and in place, `at..len`
    // lies inside it, and the caller guarantees nobody else reads or writes
    // it meanwhile. A raw write forms no reference to published bytes.
    unsafe { f(store.allocator().object_ptr(h, len).add(at), len - at) };
    true
}

/// Makes `store`'s shared memory look as a zblk of layout 3 (before
/// packed headers had a seal) left it: every packed header unsealed and the
/// file's header naming layout 3, so a test can check that a recovery
/// still takes such a store over. Returns the packed pages found, or
/// `None` for a store without shared memory.
///
/// # Safety
/// No other thread uses the store meanwhile.
#[doc(hidden)]
pub unsafe fn debug_as_layout3(store: &Store) -> Option<u64> {
    let shm = store.table.shared()?;
    let mut packed = 0;
    for page in 0..store.table.pages() {
        let guard = store.table.lock(page);
        let e = guard.entry();
        if e.kind == Kind::Packed {
            // SAFETY: the slot lock is held and nobody else uses the store
            // (the caller's contract).
            unsafe { crate::packed::debug_unseal(store.table.allocator(), &e) };
            packed += 1;
        }
    }
    let fingerprint = SlabAllocator::fingerprint_for(3);
    shm.debug_write_layout(3, fingerprint).ok()?;
    Some(packed)
}

/// Rewrites `store`'s header as layout 4 wrote it (a test's stand-in for a
/// store made by the build before several secondary algorithms): the
/// layout and its fingerprint; the header's bytes for a second and third
/// secondary are zeros as layout 4 left them, so the store must have at
/// most one. `None` for a private store.
///
/// # Safety
///
/// Nothing else may use the store meanwhile or afterwards (crash it).
pub unsafe fn debug_as_layout4(store: &Store) -> Option<()> {
    let shm = store.table.shared()?;
    if store.secondaries.list().len() > 1 {
        return None;
    }
    shm.debug_write_layout(4, SlabAllocator::fingerprint_for(4))
        .ok()
}

/// Makes `store`'s shared memory look as a zblk of layout 5 left it: the
/// header naming layout 5 with its fingerprint, and the file ending after
/// the classes' regions, with no room for dictionaries. `None` for a
/// private store or one with dictionaries (layout 5 had none).
///
/// # Safety
///
/// Nothing else may use the store meanwhile or afterwards (crash it).
pub unsafe fn debug_as_layout5(store: &Store) -> Option<()> {
    let shm = store.table.shared()?;
    if !store.cfg.dictionaries.is_empty() {
        return None;
    }
    shm.debug_write_layout(5, SlabAllocator::fingerprint_for(5))
        .ok()?;
    shm.debug_drop_dictionary_room().ok()
}

/// Simulates the death of the process serving `store`: the drain thread
/// stops where it is and everything is leaked, nothing freed or flushed,
/// so that a test can recover the store from [`Store::memory_fd`] (dup it
/// first) as a new process would. Queue contexts must be leaked too
/// (`std::mem::forget`), as a crash would leave them.
#[doc(hidden)]
pub fn debug_crash(store: Arc<Store>) {
    store.table.frees().abandon();
    // A dead process's provisioner makes no more spares.
    if let Some(mut p) = store
        .provisioner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        p.stop();
        std::mem::forget(p);
    }
    std::mem::forget(store);
}
