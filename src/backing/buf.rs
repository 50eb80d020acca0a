//! A block-aligned, optionally mlocked buffer: what `O_DIRECT` I/O needs
//! (buffer, offset and length aligned to the block), made once, before any
//! writeback or read needs it, so that neither allocates while the system
//! may be short of memory and swapping to this very device.

use crate::error::{Error, Result};
use crate::page::PAGE_SIZE;
use std::alloc::Layout;

/// `blocks` 4 KB blocks of zeroed, 4 KB-aligned memory.
pub(crate) struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the buffer is plain memory owned by this value alone; it is
// handed between threads only whole, with `&mut` for writes.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only read the bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A buffer of `blocks` blocks, locked in RAM if `mlock` (a failed
    /// mlock is logged, not fatal: the daemon's mlockall covers it anyway).
    pub(crate) fn new(blocks: usize, mlock: bool) -> Result<AlignedBuf> {
        let size = blocks.max(1) * PAGE_SIZE;
        let layout = Layout::from_size_align(size, PAGE_SIZE)
            .map_err(|e| Error::InvalidConfig(format!("backing buffer of {size} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::NoSpace { limit: 0 });
        }
        // SAFETY: `ptr..ptr+size` is the block just allocated.
        if mlock && unsafe { libc::mlock(ptr.cast(), size) } != 0 {
            log::warn!(
                "cannot mlock a backing I/O buffer: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(AlignedBuf { ptr, layout })
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialized (zeroed at first) bytes
        // owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len()) }
    }

    /// The bytes, to write.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_aligned_zeroed_and_writable() {
        let mut b = AlignedBuf::new(3, false).unwrap();
        assert_eq!(b.len(), 3 * PAGE_SIZE);
        assert_eq!(b.as_slice().as_ptr() as usize % PAGE_SIZE, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[5000] = 7;
        assert_eq!(b.as_slice()[5000], 7);
    }
}
