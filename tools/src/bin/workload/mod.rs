//! Code shared by the workload programs (`usemem`, `munmap_bench`): the page
//! pattern they write and verify, an anonymous mapping that unmaps itself,
//! and small helpers. Lives in a folder without `main.rs` so that cargo does
//! not take it for a binary; each program includes it with `mod workload;`.

#![allow(dead_code)] // each program uses a different part of it

use std::time::Duration;

/// Bytes per page (x86-64 base pages, the unit swap works in).
pub const PAGE: usize = 4096;

/// Words of 8 bytes per page.
const WORDS: usize = PAGE / 8;

/// Words per pattern block: a block is either random or one repeated word.
const BLOCK_WORDS: usize = 8;

/// Share of blocks (in 1/1000) filled with random words. Tuned so that lz4
/// compresses a page about 2.8:1, the ratio of the seed's munmap benchmark
/// and close to what real anonymous memory gives (2.75-3.0 with lz4).
const RANDOM_PER_MILLE: u64 = 190;

/// First word of every page, xor-ed with the seed: a page that is all zeros
/// or belongs to another run never verifies.
const MAGIC: u64 = 0x7a62_6c6b_5041_4745; // "zblkPAGE"

/// splitmix64: one well-mixed word from any input.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Writes the content of page `index` of stream `stream` (a worker) into
/// `words`. The content depends on all three of seed, stream and index, so
/// a page that lands in the wrong place, or a stale page, is caught.
pub fn fill_words(words: &mut [u64; WORDS], seed: u64, stream: u64, index: u64) {
    let base = mix(seed ^ mix(stream.wrapping_mul(0x1000_0000_01b3) ^ mix(index)));
    words[0] = MAGIC ^ seed;
    words[1] = (stream << 40) ^ index;
    for (b, block) in words.chunks_mut(BLOCK_WORDS).enumerate() {
        let mut r = mix(base ^ b as u64);
        let random = r % 1000 < RANDOM_PER_MILLE;
        let skip = if b == 0 { 2 } else { 0 };
        for w in block.iter_mut().skip(skip) {
            if random {
                r = mix(r);
            }
            *w = r;
        }
    }
}

/// Fills one page of memory with the pattern of `(seed, stream, index)`.
pub fn fill_page(page: &mut [u8], seed: u64, stream: u64, index: u64) {
    let mut words = [0u64; WORDS];
    fill_words(&mut words, seed, stream, index);
    for (dst, w) in page.chunks_exact_mut(8).zip(words.iter()) {
        dst.copy_from_slice(&w.to_ne_bytes());
    }
}

/// True when `page` holds exactly the pattern of `(seed, stream, index)`.
pub fn page_matches(page: &[u8], seed: u64, stream: u64, index: u64) -> bool {
    let mut words = [0u64; WORDS];
    fill_words(&mut words, seed, stream, index);
    page.chunks_exact(8)
        .zip(words.iter())
        .all(|(src, w)| src == w.to_ne_bytes())
}

/// An anonymous private mapping, unmapped on drop (or by [`Mapping::unmap`],
/// which is what the munmap benchmark times).
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    /// Maps `len` bytes of anonymous memory (not touched yet).
    pub fn new(len: usize) -> std::io::Result<Mapping> {
        // SAFETY: a fresh anonymous mapping with no address hint aliases nothing.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The mapped bytes.
    pub fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: ptr..ptr+len is mapped read-write and owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// madvise(2) over the whole mapping.
    pub fn advise(&self, advice: libc::c_int) -> std::io::Result<()> {
        // SAFETY: the range is our own mapping.
        if unsafe { libc::madvise(self.ptr.cast(), self.len, advice) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Unmaps now and returns how long munmap(2) took.
    pub fn unmap(self) -> std::io::Result<Duration> {
        let me = std::mem::ManuallyDrop::new(self);
        let t = std::time::Instant::now();
        // SAFETY: the mapping is ours and is not used after this (self is consumed).
        let rc = unsafe { libc::munmap(me.ptr.cast(), me.len) };
        let took = t.elapsed();
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(took)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours; nothing refers to it after drop.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

// SAFETY: the mapping is plain anonymous memory owned by one worker at a
// time; nothing in it is tied to the thread that mapped it.
unsafe impl Send for Mapping {}

/// A field of /proc/self/status in kB (VmRSS, VmSwap), 0 when absent.
pub fn status_kb(field: &str) -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Rounds to 3 decimals for JSON output.
pub fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_page_distinct_and_verifies() {
        let mut a = vec![0u8; PAGE];
        let mut b = vec![0u8; PAGE];
        fill_page(&mut a, 1, 0, 5);
        fill_page(&mut b, 1, 0, 6);
        assert_ne!(a, b);
        assert!(page_matches(&a, 1, 0, 5));
        assert!(!page_matches(&a, 1, 0, 6));
        assert!(!page_matches(&a, 1, 1, 5));
        assert!(!page_matches(&a, 2, 0, 5));
        a[4095] ^= 1;
        assert!(!page_matches(&a, 1, 0, 5));
        assert!(!page_matches(&[0u8; PAGE], 0, 0, 0));
    }

    #[test]
    fn pattern_compresses_about_2_8_to_1() {
        let mut page = vec![0u8; PAGE];
        let (mut orig, mut compr) = (0usize, 0usize);
        for i in 0..2000 {
            fill_page(&mut page, 7, 3, i);
            orig += PAGE;
            compr += lz4_flex::block::compress(&page).len();
        }
        let ratio = orig as f64 / compr as f64;
        assert!((2.6..3.0).contains(&ratio), "lz4 ratio {ratio}");
    }
}
