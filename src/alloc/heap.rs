//! [`HeapAllocator`]: one heap allocation per object, the simple
//! reference the slab is checked and measured against. Tests, fuzz
//! targets and benchmarks use it (cargo feature `test-support`); no
//! shipped store does.

use super::{AllocError, Handle, MemAccount, ObjAllocator};

/// One heap allocation per object: simple, correct, and the baseline the
/// slab's memory efficiency is measured against. It keeps the set of live
/// handles, so that a double free is refused and objects still live when
/// it is dropped are freed (the slab gives back its whole mapping instead).
#[derive(Debug, Default)]
pub struct HeapAllocator {
    mem: MemAccount,
    live: std::sync::Mutex<std::collections::HashSet<Handle>>,
}

/// Bytes in front of each heap object recording its length, so that a free
/// by handle alone knows what to give back.
const HEAP_HEADER: usize = 8;

impl HeapAllocator {
    /// Creates an empty heap allocator with no limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Objects allocated and not yet freed: what a leak check counts.
    #[cfg(any(test, feature = "test-support"))]
    pub fn live_objects(&self) -> usize {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn charge(size: u32) -> u64 {
        // What malloc really spends: the header and 16-byte rounding.
        (size as u64 + HEAP_HEADER as u64 + 15) & !15
    }

    /// Frees one object; returns what it was charged.
    ///
    /// # Safety
    /// `h` came from `alloc_bulk` and is freed exactly once.
    unsafe fn free_one(h: Handle) -> u64 {
        let p = h as *mut u8;
        // SAFETY: the caller's contract: the header holds the size, and the
        // box of that size plus the header is this object's.
        unsafe {
            let mut len = [0u8; HEAP_HEADER];
            std::ptr::copy_nonoverlapping(p, len.as_mut_ptr(), HEAP_HEADER);
            let size = u64::from_ne_bytes(len) as usize;
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                p,
                size + HEAP_HEADER,
            )));
            Self::charge(size as u32)
        }
    }
}

impl Drop for HeapAllocator {
    fn drop(&mut self) {
        let live = self.live.get_mut().unwrap_or_else(|e| e.into_inner());
        for h in live.drain() {
            // SAFETY: each live handle is freed once, here, and nothing can
            // use the allocator's objects once it is dropped.
            unsafe { Self::free_one(h) };
        }
    }
}

impl ObjAllocator for HeapAllocator {
    fn alloc_bulk(
        &self,
        sizes: &[u32],
        _owners: &[u64],
        out: &mut Vec<Handle>,
    ) -> Result<(), AllocError> {
        let total: u64 = sizes.iter().map(|&s| Self::charge(s)).sum();
        self.mem.try_charge(total)?;
        if crate::fail_point::fail("heap:alloc") {
            // What a refused malloc would need: the charge given back.
            self.mem.uncharge(total);
            return Err(AllocError { limit: 0 });
        }
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        for &size in sizes {
            let mut v = vec![0u8; size as usize + HEAP_HEADER].into_boxed_slice();
            v[..HEAP_HEADER].copy_from_slice(&(size as u64).to_ne_bytes());
            let h = Box::into_raw(v) as *mut u8 as Handle;
            live.insert(h);
            out.push(h);
        }
        Ok(())
    }

    fn free_bulk(&self, handles: &[Handle]) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let mut freed = 0;
        for &h in handles {
            if !live.remove(&h) {
                log::error!("heap allocator: double free or bad handle {h:#x}");
                continue;
            }
            // SAFETY: `h` was live (just removed from the set, so freed once).
            freed += unsafe { Self::free_one(h) };
        }
        self.mem.uncharge(freed);
    }

    unsafe fn object_ptr(&self, h: Handle, _len: usize) -> *mut u8 {
        // SAFETY: a live handle is the address of a boxed slice of its size
        // plus the header, so skipping the header stays inside it.
        unsafe { (h as *mut u8).add(HEAP_HEADER) }
    }

    fn mem(&self) -> &MemAccount {
        &self.mem
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_alloc_write_read_free() {
        let a = HeapAllocator::new();
        let mut hs = Vec::new();
        a.alloc_bulk(&[10, 3000, 1], &[0, 1, 2], &mut hs).unwrap();
        assert_eq!(hs.len(), 3);
        for (i, &h) in hs.iter().enumerate() {
            // SAFETY: fresh objects of at least one byte, this thread's only.
            unsafe { a.write_fresh(h, 0, &[i as u8]) };
        }
        for (i, &h) in hs.iter().enumerate() {
            // SAFETY: live objects nobody writes any more.
            assert_eq!(unsafe { a.bytes(h, 0, 1) }[0], i as u8);
        }
        assert!(a.mem_used_total() >= 3011);
        a.free_bulk(&hs);
        assert_eq!(a.mem_used_total(), 0);
        assert!(a.mem_used_max() >= 3011);
        a.free_bulk(&hs[..1]);
        assert_eq!(a.mem_used_total(), 0, "a double free is refused");
    }

    #[test]
    fn heap_limit_is_all_or_nothing() {
        let a = HeapAllocator::new();
        a.set_mem_limit(1000);
        let mut hs = Vec::new();
        assert!(a.alloc_bulk(&[600, 600], &[0, 1], &mut hs).is_err());
        assert!(hs.is_empty());
        assert_eq!(a.mem_used_total(), 0);
        a.alloc_bulk(&[600], &[0], &mut hs).unwrap();
        a.free_bulk(&hs);
    }
}
