//! The backing store's free map: how many live objects each 4 KB block
//! holds. A block is free when it holds none.
//!
//! A per-page object never crosses a block; a packed group may span
//! several, and then counts once per live page in each block it touches
//! (a block's count is the live pages of every object in it). So one
//! count per block says everything: the writeback thread reserves free
//! blocks (count 0 to the pages it packed into each; a run of contiguous
//! ones for groups that cross blocks) before writing them, and every slot
//! that lets go of a written-back page (discard, overwrite, a lost race)
//! decrements the count of each block its object touches, lock-free, from
//! whichever thread. Only
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

    /// Reserves a run of `counts.len()` contiguous free blocks (at least
    /// 1), block `i` of it for `counts[i]` (at least 1) live pages: the
    /// first such run from the cursor, wrapping (a run never wraps past the
    /// end). Returns its first block, `None` when there is no such run.
    /// The writeback thread alone calls this.
    pub(crate) fn reserve_run(&self, counts: &[u16]) -> Option<u32> {
        let n = self.counts.len();
        let len = counts.len();
        if len == 0 || len > n {
            return None;
        }
        let start = self.cursor.load(Relaxed) as usize % n;
        let mut run = 0;
        for i in 0..n + len {
            let b = (start + i) % n;
            if b == 0 {
                run = 0;
            }
            if self.counts[b].load(Relaxed) != 0 {
                run = 0;
                continue;
            }
            run += 1;
            if run == len {
                let first = b + 1 - len;
                return self.take_run(first, counts).then_some(first as u32);
            }
        }
        None
    }

    /// Sets the free blocks from `first` to their `counts`; false (and
    /// nothing taken) if one of them was not free after all.
    fn take_run(&self, first: usize, counts: &[u16]) -> bool {
        for (i, &c) in counts.iter().enumerate() {
            let taken = self.counts[first + i].compare_exchange(0, c.max(1), Relaxed, Relaxed);
            if taken.is_err() {
                for j in 0..i {
                    self.counts[first + j].store(0, Relaxed);
                }
                return false;
            }
        }
        self.used.fetch_add(counts.len() as u64, Relaxed);
        self.cursor.store((first + counts.len()) as u64, Relaxed);
        true
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
        let a = m.reserve_run(&[2]).unwrap();
        let b = m.reserve_run(&[1]).unwrap();
        let c = m.reserve_run(&[1]).unwrap();
        assert_eq!(m.reserve_run(&[1]), None, "all three in use");
        assert_eq!(m.used(), 3);
        assert_ne!(a, b);
        assert_ne!(b, c);
        assert!(m.release(a));
        assert_eq!(m.reserve_run(&[1]), None, "block a still holds one object");
        assert!(m.release(a));
        assert_eq!(m.used(), 2);
        assert!(!m.release(a), "a free block has nothing to release");
        assert_eq!(m.reserve_run(&[5]), Some(a));
    }

    #[test]
    fn runs_are_contiguous_free_blocks_and_never_wrap() {
        let m = FreeMap::new(6);
        assert_eq!(m.reserve_run(&[1, 2]), Some(0));
        assert!(m.claim(3));
        // Blocks 2 and 4-5 are free, 3 is not: a run of 2 is 4-5.
        assert_eq!(m.reserve_run(&[3, 1]), Some(4));
        assert_eq!(m.used(), 5);
        assert_eq!(m.reserve_run(&[1, 1]), None, "only block 2 is free");
        assert_eq!(m.reserve_run(&[1]), Some(2));
        assert_eq!(m.used(), 6);
        for _ in 0..3 {
            assert!(m.release(4));
        }
        assert!(m.release(5));
        assert_eq!(m.used(), 4);
        assert_eq!(m.reserve_run(&[0; 7]), None, "longer than the map");
        assert_eq!(m.reserve_run(&[]), None);
        // Block 1 holds 2 pages: freed on its second release only.
        assert!(m.release(1));
        assert_eq!(m.used(), 4);
        assert!(m.release(1));
        assert_eq!(m.used(), 3);
    }

    #[test]
    fn claims_rebuild_counts_and_refuse_out_of_range_blocks() {
        let m = FreeMap::new(2);
        assert!(m.claim(1) && m.claim(1));
        assert!(!m.claim(2));
        assert_eq!(m.used(), 1);
        assert_eq!(m.reserve_run(&[1]), Some(0));
        assert_eq!(m.reserve_run(&[1]), None);
        assert!(m.release(1) && m.release(1));
        assert_eq!(m.used(), 1);
    }
}
