//! The object allocator interface, and a plain heap allocator behind it.
//!
//! The store keeps compressed objects through [`ObjAllocator`]: sizes in,
//! opaque handles out, frees by handle, with bulk variants so that a whole
//! compression group costs one allocation call and a drained batch one free
//! call. The real allocator is the size-class slab in `crate::slab`;
//! `HeapAllocator` (one heap allocation per object, `heap.rs`, cargo
//! feature `test-support`) is the simple reference used to check it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

#[cfg(any(test, feature = "test-support"))]
mod heap;
#[cfg(any(test, feature = "test-support"))]
pub use heap::HeapAllocator;

/// An opaque, non-zero object identifier. 0 means "no object".
pub type Handle = u64;

/// The allocator refused: `mem_limit` would be exceeded or the OS gave no
/// memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocError {
    /// The limit in force (0 when the OS refused memory).
    pub limit: u64,
}

/// Moves objects on behalf of the allocator during compaction.
///
/// The allocator knows each object's owner (the slot index given at
/// allocation); the store knows how to lock that slot.
pub trait Relocate: Sync {
    /// Under the lock of slot `owner`: if the slot still references `old`,
    /// calls `mv`, which copies the object and returns its new handle, and
    /// points the slot at that handle. Returns false (and does not call `mv`)
    /// when the slot no longer holds `old`: the object is on its way to
    /// being freed and must not be moved.
    fn relocate(&self, owner: u64, old: Handle, mv: &mut dyn FnMut() -> Option<Handle>) -> bool;
}

/// A store for variable-sized objects, safe to call from many threads.
pub trait ObjAllocator: Send + Sync {
    /// Allocates one object per entry of `sizes`, owned by the matching
    /// entry of `owners` (slot indices), appending handles to `out`. All or
    /// nothing: on error no object is allocated and `out` is unchanged.
    fn alloc_bulk(
        &self,
        sizes: &[u32],
        owners: &[u64],
        out: &mut Vec<Handle>,
    ) -> Result<(), AllocError>;

    /// Frees every handle in `handles`.
    fn free_bulk(&self, handles: &[Handle]);

    /// Where the object's bytes start. Access goes through the three views
    /// below, never through this pointer directly.
    ///
    /// # Safety
    /// `h` must be a live handle of this allocator, and `len` at most the
    /// size it was allocated with.
    unsafe fn object_ptr(&self, h: Handle, len: usize) -> *mut u8;

    /// A shared view of `len` bytes at offset `at` of a published object.
    ///
    /// # Safety
    /// `h` is live and is neither freed nor moved while the view is used
    /// (the caller holds the lock of a slot that references it), `at + len`
    /// is within its allocated size, and nobody writes those bytes
    /// meanwhile: a published object's bytes never change, except a packed
    /// object's live mask, which is reached only through
    /// [`ObjAllocator::atomic_word`] and must not be inside the range.
    unsafe fn bytes(&self, h: Handle, at: usize, len: usize) -> &[u8] {
        // SAFETY: the caller's contract above: the range is allocated,
        // stays put and is not written while the shared slice lives.
        unsafe { std::slice::from_raw_parts(self.object_ptr(h, at + len).add(at), len) }
    }

    /// Copies `src` to offset `at` of an object not yet published: fresh
    /// from [`ObjAllocator::alloc_bulk`], its handle not yet in any slot.
    ///
    /// # Safety
    /// `h` is live, `at + src.len()` is within its allocated size, and no
    /// other thread can reach the object yet (its handle is the caller's
    /// alone), so nothing else reads or writes those bytes meanwhile.
    unsafe fn write_fresh(&self, h: Handle, at: usize, src: &[u8]) {
        // SAFETY: the caller's contract above: the range is allocated and
        // only this thread knows the handle; `src` cannot overlap an
        // object nobody else can reach.
        unsafe {
            let dst = self.object_ptr(h, at + src.len()).add(at);
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
        }
    }

    /// The 8-byte word at offset `at` of an object, as an atomic: a packed
    /// object's live mask, which slots holding different locks update.
    ///
    /// # Safety
    /// `h` is live and stays put while the reference is used (the caller
    /// holds the lock of a slot that references it), `at + 8` is within its
    /// allocated size, the word is 8-byte aligned (checked when the object
    /// was stored), and every access to it while the object is published
    /// is atomic.
    unsafe fn atomic_word(&self, h: Handle, at: usize) -> &AtomicU64 {
        // SAFETY: the caller's contract above; AtomicU64 has the size and
        // (given the alignment check) the alignment of the u64 there.
        unsafe { AtomicU64::from_ptr(self.object_ptr(h, at + 8).add(at).cast::<u64>()) }
    }

    /// The allocator's memory accounting (bytes held, peak, limit).
    fn mem(&self) -> &MemAccount;

    /// Bytes of memory the allocator holds, metadata and waste included.
    fn mem_used_total(&self) -> u64 {
        self.mem().used()
    }

    /// Peak of `mem_used_total` since creation or the last reset.
    fn mem_used_max(&self) -> u64 {
        self.mem().max()
    }

    /// Forgets the peak: `mem_used_max` restarts from the current use.
    #[cfg(any(test, feature = "test-support"))]
    fn reset_mem_used_max(&self) {
        self.mem().reset_max();
    }

    /// The memory limit in bytes (0: none).
    fn mem_limit(&self) -> u64 {
        self.mem().limit()
    }

    /// Sets the memory limit in bytes (0: none). Objects already stored stay.
    fn set_mem_limit(&self, bytes: u64) {
        self.mem().set_limit(bytes);
    }

    /// Moves objects to free memory, returning the number of 4 KB pages
    /// given back. The default allocator cannot move anything.
    fn compact(&self, _relocate: &dyn Relocate) -> u64 {
        0
    }

    /// Pages compaction could give back now: how fragmented the allocator
    /// is. Used to decide when to compact by itself.
    fn compactable_pages(&self) -> u64 {
        0
    }

    /// Gives back memory kept for reuse that was not reused since the
    /// previous call (run about once a second by the idle drain). Returns
    /// the 4 KB pages given back.
    fn trim(&self) -> u64 {
        0
    }

    /// 4 KB pages held for reuse (what [`ObjAllocator::trim`] may give back).
    fn spare_pages(&self) -> u64 {
        0
    }

    /// Keeps the allocator's memory reserve filled until `stop` (run on a
    /// thread of its own, see `SlabConfig::reserve`); returns at once for
    /// an allocator without one.
    fn serve_reserve(&self, _stop: &AtomicBool) {}

    /// Wakes [`ObjAllocator::serve_reserve`] (to see `stop`, or to refill).
    fn wake_reserve(&self) {}

    /// What the memory reserve did so far.
    fn reserve_stats(&self) -> ReserveStats {
        ReserveStats::default()
    }

    /// Whether free memory is below the reserve's threshold, where a
    /// writing thread must fault in no fresh page (always false without a
    /// reserve).
    fn memory_short(&self) -> bool {
        false
    }

    /// Tests: moves the memory reserve's free-memory threshold (nothing
    /// without a reserve).
    #[cfg(feature = "test-support")]
    fn debug_set_free_below(&self, _bytes: u64) {}
}

/// What an allocator's memory reserve did (all zero without one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReserveStats {
    /// Objects whose size class had neither a free object nor a spare
    /// zspage when asked.
    pub misses: u64,
    /// Of those, objects placed in a larger class.
    pub fallbacks: u64,
    /// Objects refused after waiting for the provisioner (their request
    /// failed with ENOSPC).
    pub refusals: u64,
}

/// Memory accounting every allocator keeps: bytes held, their peak, and
/// the limit past which allocations are refused.
#[derive(Debug, Default)]
pub struct MemAccount {
    used: AtomicU64,
    max: AtomicU64,
    limit: AtomicU64,
}

impl MemAccount {
    /// Charges `bytes`, or refuses (charging nothing) when that would pass
    /// the limit.
    pub fn try_charge(&self, bytes: u64) -> Result<(), AllocError> {
        let limit = self.limit.load(Relaxed);
        if crate::fail_point::fail("mem:charge") {
            return Err(AllocError { limit });
        }
        let prev = self.used.fetch_add(bytes, Relaxed);
        if limit != 0 && prev + bytes > limit {
            self.used.fetch_sub(bytes, Relaxed);
            return Err(AllocError { limit });
        }
        self.max.fetch_max(prev + bytes, Relaxed);
        Ok(())
    }

    /// Gives back `bytes` charged earlier.
    pub fn uncharge(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Relaxed);
    }

    /// Bytes held.
    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// Peak of bytes held.
    pub fn max(&self) -> u64 {
        self.max.load(Relaxed)
    }

    /// Restarts the peak from the current use.
    #[cfg(any(test, feature = "test-support"))]
    pub fn reset_max(&self) {
        self.max.store(self.used(), Relaxed);
    }

    /// The limit in bytes (0: none).
    pub fn limit(&self) -> u64 {
        self.limit.load(Relaxed)
    }

    /// Sets the limit in bytes (0: none).
    pub fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes, Relaxed);
    }
}
