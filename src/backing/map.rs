//! The backing store's free map: how many live objects each 4 KB block
//! holds. A block is free when it holds none.
//!
//! Objects never cross a block, so one count per block says everything:
//! the writeback thread reserves free blocks (count 0 to the number of
//! objects it packed into each) before writing them, and every slot that
//! lets go of a written-back page (discard, overwrite, a lost race)
//! decrements its block's count, lock-free, from whichever thread. Only
//! the writeback thread (one at a time, under the store's maintenance
//! lock) turns a 0 into anything else, so a block cannot be reserved
//! twice. A partly freed block keeps its space until its last object goes
//! (compacting the backing store is a later step).
//!
//! The map lives in private memory: a recovered store rebuilds it from the
//! written-back slots (`FreeMap::claim`), which are the only truth.

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering::Relaxed};

/// Live objects per block.
pub(crate) struct FreeMap {
    counts: Box<[AtomicU16]>,
    /// Blocks holding at least one object.
    used: AtomicU64,
    /// Where the next search for free blocks starts.
    cursor: AtomicU64,
}

impl FreeMap {
    /// A map of `blocks` free blocks.
    pub(crate) fn new(blocks: u32) -> FreeMap {
        FreeMap {
            counts: (0..blocks).map(|_| AtomicU16::new(0)).collect(),
            used: AtomicU64::new(0),
            cursor: AtomicU64::new(0),
        }
    }

    /// Blocks in the map.
    pub(crate) fn blocks(&self) -> u32 {
        self.counts.len() as u32
    }

    /// Blocks holding at least one object.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// Reserves one free block for `objects` (at least 1) objects: the
    /// next free one from the cursor, wrapping. `None` when every block is
    /// in use. The writeback thread alone calls this.
    pub(crate) fn reserve(&self, objects: u16) -> Option<u32> {
        let n = self.counts.len() as u64;
        let start = self.cursor.load(Relaxed);
        for i in 0..n {
            let b = ((start + i) % n) as usize;
            if self.counts[b]
                .compare_exchange(0, objects.max(1), Relaxed, Relaxed)
                .is_ok()
            {
                self.used.fetch_add(1, Relaxed);
                self.cursor.store(b as u64 + 1, Relaxed);
                return Some(b as u32);
            }
        }
        None
    }

    /// One object of `block` is gone; the block is free once all are.
    /// Returns false (and changes nothing) if the block had none: a bug or
    /// a corrupt slot, logged by the caller.
    pub(crate) fn release(&self, block: u32) -> bool {
        let Some(c) = self.counts.get(block as usize) else {
            return false;
        };
        match c.fetch_update(Relaxed, Relaxed, |v| v.checked_sub(1)) {
            Ok(1) => {
                self.used.fetch_sub(1, Relaxed);
                true
            }
            Ok(_) => true,
            Err(_) => false,
        }
    }

    /// Recovery: one more object lives in `block`. False if the block is
    /// out of range or full (an entry that cannot be trusted).
    pub(crate) fn claim(&self, block: u32) -> bool {
        let Some(c) = self.counts.get(block as usize) else {
            return false;
        };
        match c.fetch_update(Relaxed, Relaxed, |v| v.checked_add(1)) {
            Ok(0) => {
                self.used.fetch_add(1, Relaxed);
                true
            }
            Ok(_) => true,
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_each_free_block_once_and_frees_on_the_last_release() {
        let m = FreeMap::new(3);
        let a = m.reserve(2).unwrap();
        let b = m.reserve(1).unwrap();
        let c = m.reserve(1).unwrap();
        assert_eq!(m.reserve(1), None, "all three in use");
        assert_eq!(m.used(), 3);
        assert_ne!(a, b);
        assert_ne!(b, c);
        assert!(m.release(a));
        assert_eq!(m.reserve(1), None, "block a still holds one object");
        assert!(m.release(a));
        assert_eq!(m.used(), 2);
        assert!(!m.release(a), "a free block has nothing to release");
        assert_eq!(m.reserve(5), Some(a));
    }

    #[test]
    fn claims_rebuild_counts_and_refuse_out_of_range_blocks() {
        let m = FreeMap::new(2);
        assert!(m.claim(1) && m.claim(1));
        assert!(!m.claim(2));
        assert_eq!(m.used(), 1);
        assert_eq!(m.reserve(1), Some(0));
        assert_eq!(m.reserve(1), None);
        assert!(m.release(1) && m.release(1));
        assert_eq!(m.used(), 1);
    }
}
