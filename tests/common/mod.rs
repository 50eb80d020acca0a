//! Page generators shared by the engine's integration tests, and the
//! model the model-based ones check a store against.
#![allow(dead_code)]

pub mod model;

use std::os::fd::OwnedFd;
use std::sync::Arc;
use zblk::{QueueCtx, Store, StoreConfig, PAGE_SIZE};

/// The fixture of real memory pages shipped with the tests.
pub fn real_pages() -> Vec<u8> {
    let raw = include_bytes!("../fixtures/realmem-96.bin.zst");
    zstd::stream::decode_all(&raw[..]).expect("fixture decompresses")
}

/// A small deterministic generator (xorshift64*), so tests need no crate.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Kinds of page content the store treats differently.
#[derive(Debug, Clone, Copy)]
pub enum Content {
    Zeros,
    SameWord(u64),
    Text(u64),
    Real(usize),
    Random(u64),
}

/// Builds one page of the given content.
pub fn page(c: Content, real: &[u8]) -> Vec<u8> {
    match c {
        Content::Zeros => vec![0; PAGE_SIZE],
        Content::SameWord(w) => w
            .to_ne_bytes()
            .iter()
            .copied()
            .cycle()
            .take(PAGE_SIZE)
            .collect(),
        Content::Text(seed) => format!("page {seed} of compressible text, repeated; ")
            .bytes()
            .cycle()
            .take(PAGE_SIZE)
            .collect(),
        Content::Real(i) => {
            let n = real.len() / PAGE_SIZE;
            let i = i % n;
            real[i * PAGE_SIZE..(i + 1) * PAGE_SIZE].to_vec()
        }
        Content::Random(seed) => {
            let mut r = Rng(seed | 1);
            (0..PAGE_SIZE / 8)
                .flat_map(|_| r.next().to_ne_bytes())
                .collect()
        }
    }
}

/// Whether a page is one 8-byte word repeated (the engine stores those in
/// the slot, with no object): an independent check of the engine's own.
pub fn same_filled(page: &[u8]) -> bool {
    page.chunks_exact(8).all(|w| w == &page[..8])
}

/// Keeps freed heap memory mapped, as the daemon does (`keep_heap`), so
/// that the codecs' scratch allocations do not fault either.
pub fn keep_heap() {
    // SAFETY: mallopt only changes malloc's tunables.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
    }
}

/// Minor page faults the calling thread took so far.
pub fn thread_faults() -> u64 {
    // SAFETY: getrusage fills the struct it is given; zeroed is a valid
    // starting value for a plain C struct.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_THREAD asks about the calling thread.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    assert_eq!(r, 0, "getrusage: {}", std::io::Error::last_os_error());
    u.ru_minflt as u64
}

/// glibc's `mallinfo2`, every arena: (bytes the heap took from the
/// system, bytes in use). Sees the C codecs' allocations too.
pub fn heap_bytes() -> (usize, usize) {
    // SAFETY: mallinfo2 only reads malloc's own counters.
    let m = unsafe { libc::mallinfo2() };
    (m.arena + m.hblkhd, m.uordblks)
}

/// Kills the process serving `store` as a crash would, its queue context
/// `ctx` leaked with it (and its unflushed free batch), and returns the
/// store's shared memory.
pub fn crash(store: Arc<Store>, ctx: QueueCtx) -> OwnedFd {
    let fd = store
        .memory_fd()
        .expect("a shared store has a memfd")
        .try_clone_to_owned()
        .unwrap();
    std::mem::forget(ctx);
    zblk::debug_crash(store);
    fd
}

/// Kills the process serving `store` as [`crash`] does and recovers the
/// store with `cfg` from its shared memory, as a new process would.
pub fn crash_and_recover(store: Arc<Store>, ctx: QueueCtx, cfg: StoreConfig) -> Arc<Store> {
    Store::recover(cfg, crash(store, ctx)).unwrap()
}
