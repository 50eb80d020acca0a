//! Helpers shared by zblk's fuzz targets: page contents the fuzzer steers
//! (zeros, same-filled, text, noise, raw bytes) and store configurations.

use arbitrary::Arbitrary;
use zblk::{Algo, Mode, StoreConfig, PAGE_SIZE};

/// What one page of a write holds. Every kind the store treats apart is
/// reachable: zeros and same-filled words (no object), text (compresses),
/// noise (stored raw, huge), and bytes of the input itself.
#[derive(Arbitrary, Debug, Clone)]
pub enum Fill {
    /// All zeros.
    Zeros,
    /// One 8-byte word repeated (a same-filled page).
    Word(u64),
    /// Text-like bytes from a seed: compresses well.
    Text(u16),
    /// Pseudo-random bytes from a seed: does not compress (huge).
    Noise(u32),
    /// Mostly one byte with a few others: compresses, not same-filled.
    Sparse(u8, u16),
    /// These bytes, repeated over the page.
    Bytes(Vec<u8>),
}

impl Fill {
    /// Fills `out` (one page or less) as this content; `salt` makes the
    /// same fill differ from page to page where it is not meant to be
    /// uniform (text, noise, sparse).
    ///
    /// Written to run few comparisons per byte: the fuzz build traces every
    /// integer comparison (`-sanitizer-coverage-trace-compares`), and a
    /// byte-at-a-time loop here was a fifth of store_ops' and ublk_dispatch's
    /// time (perf). The bytes are exactly those of the plain per-byte
    /// definitions in the comments, so corpus inputs keep their meaning.
    pub fn fill(&self, out: &mut [u8], salt: u64) {
        match self {
            Fill::Zeros => out.fill(0),
            // out[i] = w.to_ne_bytes()[i % 8]
            Fill::Word(w) => repeat(out, &w.to_ne_bytes()),
            // Words drawn by a xorshift, cut off at the end of `out`.
            Fill::Text(seed) => {
                const WORDS: [&[u8]; 8] = [
                    b"swap ",
                    b"page ",
                    b"zblk ",
                    b"the ",
                    b"compressed ",
                    b"ram ",
                    b"block ",
                    b"device ",
                ];
                let mut x = u64::from(*seed) ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                let mut i = 0;
                while i < out.len() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let w = WORDS[(x % 8) as usize];
                    let k = w.len().min(out.len() - i);
                    out[i..i + k].copy_from_slice(&w[..k]);
                    i += k;
                }
            }
            // One xorshift step per byte, its low byte.
            Fill::Noise(seed) => {
                let mut x = (u64::from(*seed) << 1 | 1) ^ salt.wrapping_mul(0xd1b5_4a32_d192_ed03);
                let mut step = || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                };
                let mut chunks = out.chunks_exact_mut(8);
                for c in &mut chunks {
                    let b = [
                        step(),
                        step(),
                        step(),
                        step(),
                        step(),
                        step(),
                        step(),
                        step(),
                    ];
                    c.copy_from_slice(&b);
                }
                for b in chunks.into_remainder() {
                    *b = step();
                }
            }
            // `byte`, with every `every`-th byte from `salt % every` on
            // raised by its index + 1.
            Fill::Sparse(byte, every) => {
                out.fill(*byte);
                let step = usize::from(*every).max(1);
                let first = (salt as usize) % step;
                for (i, b) in out.iter_mut().enumerate().skip(first).step_by(step) {
                    *b = b.wrapping_add((i as u8).wrapping_add(1));
                }
            }
            Fill::Bytes(v) if v.is_empty() => out.fill(0),
            // out[i] = v[i % v.len()]
            Fill::Bytes(v) => repeat(out, v),
        }
    }
}

/// `out[i] = pat[i % pat.len()]` (`pat` not empty): the pattern once, then
/// the filled prefix copied after itself (its length stays a multiple of
/// the period), a handful of memcpys instead of a loop over every byte.
fn repeat(out: &mut [u8], pat: &[u8]) {
    let first = pat.len().min(out.len());
    out[..first].copy_from_slice(&pat[..first]);
    let mut have = first;
    while have < out.len() {
        let k = have.min(out.len() - have);
        out.copy_within(..k, have);
        have += k;
    }
}

/// Builds `len` bytes, page by page from `fills` (cycled); `base` salts
/// each page with its page number.
pub fn make_data(fills: &[Fill], len: usize, base: u64) -> Vec<u8> {
    let mut data = vec![0u8; len];
    fill_data(fills, &mut data, base);
    data
}

/// [`make_data`] into a buffer the caller keeps: `out` page by page from
/// `fills` (cycled; all zeros if there are none), page `i` salted `base + i`.
pub fn fill_data(fills: &[Fill], out: &mut [u8], base: u64) {
    if fills.is_empty() {
        out.fill(0);
        return;
    }
    for (i, chunk) in out.chunks_mut(PAGE_SIZE).enumerate() {
        fills[i % fills.len()].fill(chunk, base + i as u64);
    }
}

/// A compression algorithm the fuzzer picks (deflate-iaa has its own
/// target: without a device it is the software deflate path).
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum AlgoSel {
    /// lz4.
    Lz4,
    /// lz4hc at level 1 + n % 12.
    Lz4Hc(u8),
    /// zstd at level 1 + n % 3.
    Zstd(u8),
    /// deflate at level 1 + n % 2.
    Deflate(u8),
}

impl AlgoSel {
    /// The engine's algorithm.
    pub fn algo(self) -> Algo {
        match self {
            AlgoSel::Lz4 => Algo::Lz4,
            AlgoSel::Lz4Hc(l) => Algo::Lz4Hc(1 + i32::from(l % 12)),
            AlgoSel::Zstd(l) => Algo::Zstd(1 + i32::from(l % 3)),
            AlgoSel::Deflate(l) => Algo::Deflate(1 + i32::from(l % 2)),
        }
    }
}

/// A store's shape as the fuzzer picks it.
#[derive(Arbitrary, Debug, Clone)]
pub struct Setup {
    /// Device pages: 1 + n % 64.
    pub pages: u8,
    /// Algorithm.
    pub algo: AlgoSel,
    /// Packed (true) or per-page objects.
    pub packed: bool,
    /// Pages per compression group: 1 + n % 64 (MAX_GROUP_PAGES).
    pub group: u8,
    /// The heap allocator instead of the slab.
    pub heap: bool,
    /// Frees on the queue thread instead of the drain.
    pub sync_free: bool,
    /// Huge threshold: n % 4 selects 3/4 page (default), 1/2, 1/4 or a
    /// whole page.
    pub huge: u8,
}

impl Setup {
    /// Device pages.
    pub fn page_count(&self) -> u64 {
        1 + u64::from(self.pages % 64)
    }

    /// The store configuration.
    pub fn config(&self) -> StoreConfig {
        let mut cfg = StoreConfig::new(self.page_count() * PAGE_SIZE as u64);
        cfg.algo = self.algo.algo();
        cfg.mode = if self.packed {
            Mode::Packed
        } else {
            Mode::PerPage
        };
        cfg.group_pages = 1 + usize::from(self.group) % zblk::MAX_GROUP_PAGES;
        if self.heap {
            cfg.allocator = zblk::AllocatorKind::Heap;
        }
        cfg.deferred_free = !self.sync_free;
        cfg.huge_threshold = match self.huge % 4 {
            0 => zblk::DEFAULT_HUGE_THRESHOLD,
            1 => PAGE_SIZE / 2,
            2 => PAGE_SIZE / 4,
            _ => PAGE_SIZE,
        };
        cfg
    }
}
