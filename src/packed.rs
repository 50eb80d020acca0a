//! Packed mode: a compression group's pages compressed together as one
//! object.
//!
//! Compressing 8 pages together finds matches across them (real memory:
//! zstd:1 ratio 5.72 packed vs 5.11 per page) and costs one codec call. The
//! price is paid on reads, which decompress the whole group (a per-thread
//! cache serves the other pages of the group for free), and on discards,
//! which leave dead pages inside a live object until the compactor rewrites
//! groups that fall below half live.
//!
//! The object starts with a 32-byte header:
//! `live` (atomic bit mask of group offsets still referenced by a slot),
//! `orig` (offsets present in the blob), `base` (the group's first page, the
//! object's owner for compaction) and `id` (unique per object, the key of
//! the read cache). A slot clears its bit under its own lock; the slot that
//! clears the last bit frees the object.

use crate::alloc::{Handle, ObjAllocator};
use crate::page::PAGE_SIZE;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of header in front of a packed blob.
pub const PACK_HEADER: usize = 32;

/// The fixed fields of a packed object's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackHeader {
    /// Offsets (within the group) whose pages are in the blob, in order.
    pub orig: u64,
    /// The group's first page.
    pub base: u64,
    /// Unique object id.
    pub id: u64,
}

impl PackHeader {
    /// Writes a new header (all pages live) at the start of `obj`.
    pub fn write(&self, obj: &mut [u8]) {
        obj[0..8].copy_from_slice(&self.orig.to_ne_bytes());
        obj[8..16].copy_from_slice(&self.orig.to_ne_bytes());
        obj[16..24].copy_from_slice(&self.base.to_ne_bytes());
        obj[24..32].copy_from_slice(&self.id.to_ne_bytes());
    }

    /// Reads the fixed fields of `obj`'s header.
    pub fn read(obj: &[u8]) -> PackHeader {
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&obj[i..i + 8]);
            u64::from_ne_bytes(b)
        };
        PackHeader {
            orig: word(8),
            base: word(16),
            id: word(24),
        }
    }

    /// The page's position in the blob, from its group offset.
    pub fn position(&self, idx: u8) -> usize {
        (self.orig & ((1u64 << idx) - 1)).count_ones() as usize
    }
}

/// The live mask of the packed object at `h`.
///
/// # Safety
/// `h` must be a live packed object of `alloc` (the caller holds the lock of
/// a slot that references it), 8-byte aligned (checked when it was stored).
unsafe fn live_mask(alloc: &dyn ObjAllocator, h: Handle) -> &AtomicU64 {
    let p = alloc.object(h, PACK_HEADER).as_mut_ptr() as *mut u64;
    AtomicU64::from_ptr(p)
}

/// Whether an object is aligned well enough to hold the atomic live mask.
pub fn aligned(alloc: &dyn ObjAllocator, h: Handle) -> bool {
    // SAFETY: only the address is taken.
    let p = unsafe { alloc.object(h, PACK_HEADER).as_ptr() };
    (p as usize) % std::mem::align_of::<AtomicU64>() == 0
}

/// Clears page `idx`'s live bit; returns true when it was the last one (the
/// caller then frees the object).
///
/// # Safety
/// As [`live_mask`]; the caller holds the lock of the slot referencing page
/// `idx`, which it is emptying.
pub unsafe fn clear_live(alloc: &dyn ObjAllocator, h: Handle, idx: u8) -> bool {
    let bit = 1u64 << idx;
    let prev = live_mask(alloc, h).fetch_and(!bit, Ordering::AcqRel);
    prev & !bit == 0
}

/// Pages still live in the object.
///
/// # Safety
/// As [`live_mask`].
pub unsafe fn live_count(alloc: &dyn ObjAllocator, h: Handle) -> u32 {
    live_mask(alloc, h).load(Ordering::Acquire).count_ones()
}

/// Page `pos`'s share of a blob of `len` bytes holding `n` pages: the shares
/// of all pages add up to `len` exactly.
pub fn share(len: u32, n: u8, pos: usize) -> i64 {
    let n = n.max(1) as u32;
    (len / n + u32::from((pos as u32) < len % n)) as i64
}

/// A per-thread cache of the last packed group decompressed, so that a read
/// of several pages of one group decompresses it once.
#[derive(Debug, Default)]
pub struct PackCache {
    id: u64,
    pages: Vec<u8>,
}

impl PackCache {
    /// Creates a cache with room for `g` pages.
    pub fn with_capacity(g: usize) -> Self {
        PackCache {
            id: 0,
            pages: vec![0; g * PAGE_SIZE],
        }
    }

    /// The cached page at `pos` if the cache holds object `id`.
    pub fn get(&self, id: u64, pos: usize) -> Option<&[u8]> {
        if id != 0 && self.id == id {
            self.pages.get(pos * PAGE_SIZE..(pos + 1) * PAGE_SIZE)
        } else {
            None
        }
    }

    /// The buffer to decompress `n` pages into; invalidates the cache until
    /// [`PackCache::set`] names what it now holds.
    pub fn buffer(&mut self, n: usize) -> &mut [u8] {
        self.id = 0;
        if self.pages.len() < n * PAGE_SIZE {
            self.pages.resize(n * PAGE_SIZE, 0);
        }
        &mut self.pages[..n * PAGE_SIZE]
    }

    /// Records that the buffer now holds object `id`.
    pub fn set(&mut self, id: u64) {
        self.id = id;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up() {
        for len in [0u32, 1, 7, 8, 9, 1000, 32767] {
            for n in 1u8..=64 {
                let sum: i64 = (0..n as usize).map(|p| share(len, n, p)).sum();
                assert_eq!(sum, len as i64, "len {len} n {n}");
            }
        }
    }

    #[test]
    fn header_round_trips_and_positions() {
        let h = PackHeader {
            orig: 0b1011_0110,
            base: 99,
            id: 7,
        };
        let mut obj = [0u8; PACK_HEADER];
        h.write(&mut obj);
        assert_eq!(PackHeader::read(&obj), h);
        assert_eq!(h.position(1), 0);
        assert_eq!(h.position(2), 1);
        assert_eq!(h.position(4), 2);
        assert_eq!(h.position(7), 4);
    }
}
