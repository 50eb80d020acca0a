//! Page-sized helpers: the same-filled test and fills, and faulting in a
//! thread's own memory.

/// Bytes in a page: the unit zblk stores.
pub const PAGE_SIZE: usize = 4096;
/// `PAGE_SIZE` as u64, for byte offsets.
pub const PAGE_SIZE_U64: u64 = PAGE_SIZE as u64;
/// Most pages a store may have (a 256 TiB device): what the shared-memory
/// layout has slot room for (`crate::shm`), and what a packed header's
/// `base` field holds (`crate::packed`).
pub const MAX_PAGES: u64 = 1 << 36;

/// Returns the repeated word if `page` is one 8-byte word repeated (zram's
/// same-filled page: such pages are kept in the slot with no allocation).
#[inline]
pub fn same_filled(page: &[u8]) -> Option<u64> {
    let (head, _) = page.split_first_chunk::<8>()?;
    let word = u64::from_ne_bytes(*head);
    // Compare 64-byte blocks against a block of the word: vectorises well and
    // stops at the first differing block, which for most pages is the first.
    let mut pattern = [0u8; 64];
    fill_word(&mut pattern, word);
    let mut chunks = page.chunks_exact(64);
    for c in &mut chunks {
        if c != pattern {
            return None;
        }
    }
    let tail = chunks.remainder();
    if tail.len() % 8 == 0 && tail.chunks_exact(8).all(|c| c == head) {
        Some(word)
    } else {
        None
    }
}

/// Fills `page` with the 8-byte `word` repeated.
#[inline]
pub fn fill_word(page: &mut [u8], word: u64) {
    let bytes = word.to_ne_bytes();
    for c in page.chunks_exact_mut(8) {
        c.copy_from_slice(&bytes);
    }
}

/// Bytes of stack [`prefault_thread`] touches: deeper than any path of the
/// engine's threads goes.
const STACK_ROOM: usize = 256 << 10;

/// Faults in a thread's own memory before it serves: `arena` bytes of its
/// malloc arena (allocated, touched and freed; it stays in the arena where
/// trimming is off, as the daemon has it) and [`STACK_ROOM`] of its stack.
///
/// A swap device's threads run when memory has run out: a first touch of a
/// heap or stack page then waits in reclaim, and one taken while holding a
/// size class's lock stops every queue thread behind it, and with them
/// every swap write reclaim waits for. Growing an arena later is also an
/// `mprotect`, which waits for `mmap_lock`. The daemon's `mlockall` keeps
/// these pages once touched.
pub(crate) fn prefault_thread(arena: usize) {
    let mut room = vec![0u8; arena];
    touch_pages(&mut room, 1);
    drop(room);
    touch_stack(STACK_ROOM);
}

/// Writes `byte` to one byte of each page `buf` spans, so that every page
/// is faulted in now; volatile, so that the writes are neither elided nor
/// folded into a zeroing allocation (`calloc`, which leaves fresh pages
/// untouched).
pub(crate) fn touch_pages(buf: &mut [u8], byte: u8) {
    // SAFETY: the range is `buf`, exclusively ours.
    unsafe { touch_raw(buf.as_mut_ptr(), buf.len(), byte) };
}

/// [`touch_pages`] over `len` bytes at `p`: the first byte, then the first
/// byte of each page that starts inside the range.
///
/// # Safety
/// `p..p + len` is memory the caller may write and nobody else uses
/// meanwhile (initialized or not: only bytes are written).
pub(crate) unsafe fn touch_raw(p: *mut u8, len: usize, byte: u8) {
    if len == 0 {
        return;
    }
    // SAFETY: the caller's contract; `p` is inside the range.
    unsafe { std::ptr::write_volatile(p, byte) };
    let first_page = (p as usize).next_multiple_of(PAGE_SIZE) - p as usize;
    for off in (first_page..len).step_by(PAGE_SIZE) {
        // SAFETY: `off < len`, inside the caller's range.
        unsafe { std::ptr::write_volatile(p.add(off), byte) };
    }
}

/// Touches `bytes` of the stack below the caller's frame.
#[inline(never)]
fn touch_stack(bytes: usize) {
    const STEP: usize = 16 << 10;
    let mut frame = [0u8; STEP];
    touch_pages(&mut frame, 1);
    if bytes > STEP {
        touch_stack(bytes - STEP);
    }
    std::hint::black_box(&frame);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touch_pages_reaches_every_page_of_an_unaligned_buffer() {
        const PAGES: usize = 4;
        // SAFETY: a fresh private anonymous mapping; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGES * PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: the mapping just made, ours alone, read and written only
        // through this slice, unmapped at the end.
        let all = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), PAGES * PAGE_SIZE) };
        // Not page-aligned at either end, and spanning one page more than
        // its length in pages: from 96 bytes before the end of the first
        // page to 104 bytes into the last.
        touch_pages(&mut all[PAGE_SIZE - 96..(PAGES - 1) * PAGE_SIZE + 104], 1);
        let mut present = vec![0u8; PAGES];
        // SAFETY: `p` is page-aligned and the vector has one byte a page.
        let r = unsafe { libc::mincore(p, PAGES * PAGE_SIZE, present.as_mut_ptr()) };
        assert_eq!(r, 0);
        assert!(present.iter().all(|&b| b & 1 == 1), "{present:?}");
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(p, PAGES * PAGE_SIZE) };
    }

    #[test]
    fn same_filled_detects_words() {
        assert_eq!(same_filled(&[0u8; PAGE_SIZE]), Some(0));
        let mut p = vec![0u8; PAGE_SIZE];
        fill_word(&mut p, 0x0102030405060708);
        assert_eq!(same_filled(&p), Some(0x0102030405060708));
        for pos in [0, 7, 8, 63, 64, 4095] {
            let mut q = p.clone();
            q[pos] ^= 1;
            assert_eq!(same_filled(&q), None, "pos {pos}");
        }
    }
}
