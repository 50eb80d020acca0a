//! Codec-failure injection: a codec (set through `StoreConfig::codecs`)
//! wrapping each software codec, whose compress or decompress fails at a
//! chosen call, against a model.
//!
//! What the engine does, and what is checked:
//! - compress returns an error: the write fails cleanly with EIO
//!   (`Error::Codec`); nothing is stored raw in its place. As for
//!   allocation failures, the request is cut at a compression group: the
//!   groups before the failed one hold the new data, the rest the old.
//! - compress claims more output than its buffer holds (a lying or broken
//!   codec): refused the same way, EIO, never stored (before the fix the
//!   bytes past the buffer were stored, or the slice panicked);
//! - decompress fails: that read gets EIO (`Error::Corrupt`), the failed
//!   page is zeroed in the caller's buffer (never a wrong page), and the
//!   page is intact: the next read returns it; a compaction that meets the
//!   failure leaves the page where it was;
//! - at the end, every page matches the model, the gauges the recount, and
//!   discarding everything leaves no memory charged.

mod common;

use common::{page, real_pages, same_filled, Content, Rng};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::SeqCst};
use std::sync::Arc;
use zblk::codec::{Codec, CodecError};
use zblk::{Algo, CodecFactory, Error, Mode, QueueCtx, Store, StoreConfig, PAGE_SIZE};

const PAGES: u64 = 64;
const GROUP: u64 = 8;
const OPS: usize = 150;

/// How the armed compress call fails.
const FAIL_ERR: u8 = 0;
/// Claims one byte more than the buffer holds (still within a page).
const FAIL_ONE_MORE: u8 = 1;
/// Claims far more than the buffer (past the scratch of a group).
const FAIL_HUGE_CLAIM: u8 = 2;

/// Shared by every codec the factory makes: call counters and what to fail.
#[derive(Default)]
struct Plan {
    compress_calls: AtomicU64,
    decompress_calls: AtomicU64,
    /// Call number (1-based) of compress to fail; 0: none.
    compress_at: AtomicU64,
    compress_how: AtomicU8,
    decompress_at: AtomicU64,
    fired: AtomicBool,
}

struct Faulty {
    inner: Box<dyn Codec>,
    plan: Arc<Plan>,
}

impl Codec for Faulty {
    fn algo(&self) -> Algo {
        self.inner.algo()
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
        let n = self.plan.compress_calls.fetch_add(1, SeqCst) + 1;
        if n != self.plan.compress_at.load(SeqCst) {
            return self.inner.compress(src, dst);
        }
        self.plan.fired.store(true, SeqCst);
        match self.plan.compress_how.load(SeqCst) {
            FAIL_ERR => Err(CodecError::Internal("injected compress failure".into())),
            FAIL_ONE_MORE => Ok(Some(dst.len() + 1)),
            FAIL_HUGE_CLAIM => Ok(Some(dst.len() * 64 + PAGE_SIZE)),
            how => unreachable!("no failure mode {how}"),
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        let n = self.plan.decompress_calls.fetch_add(1, SeqCst) + 1;
        if n == self.plan.decompress_at.load(SeqCst) {
            self.plan.fired.store(true, SeqCst);
            // Half decoded, then the failure: the engine must not hand it out.
            dst.fill(0xa5);
            return Err(CodecError::Corrupt("injected decompress failure".into()));
        }
        self.inner.decompress(src, dst)
    }
}

struct Rig {
    store: Arc<Store>,
    ctx: QueueCtx,
    plan: Arc<Plan>,
    model: Vec<Option<Vec<u8>>>,
}

fn rig(algo: Algo, mode: Mode) -> Rig {
    let plan = Arc::new(Plan::default());
    let mut cfg = StoreConfig::new(PAGES * PAGE_SIZE as u64);
    cfg.algo = algo;
    cfg.mode = mode;
    cfg.group_pages = GROUP as usize;
    cfg.deferred_free = false;
    let p = plan.clone();
    cfg.codecs = Some(CodecFactory(Arc::new(move || {
        Box::new(Faulty {
            inner: algo.new_codec(),
            plan: p.clone(),
        }) as Box<dyn Codec>
    })));
    let store = Store::new(cfg).unwrap();
    Rig {
        ctx: store.new_ctx(),
        store,
        plan,
        model: vec![None; PAGES as usize],
    }
}

fn expected(model: &[Option<Vec<u8>>], p: u64) -> Vec<u8> {
    model[p as usize]
        .clone()
        .unwrap_or_else(|| vec![0; PAGE_SIZE])
}

impl Rig {
    fn read(&mut self, p: u64) -> Vec<u8> {
        let mut buf = vec![0u8; PAGE_SIZE];
        self.ctx.read(p * PAGE_SIZE as u64, &mut buf).unwrap();
        buf
    }

    fn verify_all(&mut self, why: &str) {
        for p in 0..PAGES {
            assert!(self.read(p) == expected(&self.model, p), "{why}: page {p}");
        }
    }

    fn write(&mut self, first: u64, data: Vec<Vec<u8>>, why: &str) -> bool {
        let groups = self.store.stats().counters.groups;
        let r = self.ctx.write(first * PAGE_SIZE as u64, &data.concat());
        let fired = self.plan.fired.swap(false, SeqCst);
        let done = match r {
            Ok(()) => {
                assert!(!fired, "{why}: a failed compress was swallowed");
                data.len() as u64
            }
            Err(e) => {
                assert!(fired, "{why}: failed with no fault: {e}");
                assert!(matches!(e, Error::Codec(_)), "{why}: {e:?}");
                assert_eq!(e.errno(), -libc::EIO, "{why}");
                (self.store.stats().counters.groups - groups) * GROUP
            }
        };
        for (i, d) in data.into_iter().enumerate() {
            let p = first + i as u64;
            if (i as u64) < done {
                self.model[p as usize] = Some(d);
            }
            assert!(self.read(p) == expected(&self.model, p), "{why}: page {p}");
        }
        fired
    }

    /// Reads `n` pages from `first` with the next decompression failing.
    fn read_failing(&mut self, first: u64, n: u64, why: &str) -> bool {
        let calls = self.plan.decompress_calls.load(SeqCst);
        self.plan.decompress_at.store(calls + 1, SeqCst);
        let mut buf = vec![0x5au8; n as usize * PAGE_SIZE];
        let r = self.ctx.read(first * PAGE_SIZE as u64, &mut buf);
        self.plan.decompress_at.store(0, SeqCst);
        let fired = self.plan.fired.swap(false, SeqCst);
        match r {
            Ok(()) => {
                assert!(!fired, "{why}: a failed decompress was swallowed");
                for (i, got) in buf.chunks_exact(PAGE_SIZE).enumerate() {
                    let p = first + i as u64;
                    assert!(got == expected(&self.model, p), "{why}: page {p}");
                }
            }
            Err(e) => {
                assert!(fired, "{why}: failed with no fault: {e}");
                let Error::Corrupt { page: bad, .. } = e else {
                    panic!("{why}: {e:?}");
                };
                assert_eq!(e.errno(), -libc::EIO, "{why}");
                for (i, got) in buf.chunks_exact(PAGE_SIZE).enumerate() {
                    let p = first + i as u64;
                    if p < bad {
                        assert!(got == expected(&self.model, p), "{why}: page {p}");
                    } else if p == bad {
                        assert!(got.iter().all(|&b| b == 0), "{why}: failed page handed out");
                    }
                }
                // The failure was the read's, not the page's.
                assert!(self.read(bad) == expected(&self.model, bad), "{why}: lost");
            }
        }
        fired
    }

    fn check_end(&mut self, why: &str) {
        self.verify_all(why);
        let c = self.store.stats().counters;
        let stored: Vec<&Vec<u8>> = self.model.iter().flatten().collect();
        assert_eq!(c.stored_pages, stored.len() as u64, "{why}: stored");
        let same = stored.iter().filter(|p| same_filled(p)).count() as u64;
        assert_eq!(c.same_pages, same, "{why}: same");
        self.ctx.discard(0, PAGES * PAGE_SIZE as u64).unwrap();
        self.ctx.flush_frees();
        let s = self.store.stats();
        assert_eq!(s.counters.stored_pages, 0, "{why}");
        assert_eq!(s.counters.compr_data_size, 0, "{why}");
        assert_eq!(s.mem_used_total, 0, "{why}: memory still charged");
    }
}

fn contents(r: &mut Rng, n: u64) -> Vec<Content> {
    (0..n)
        .map(|_| match r.below(5) {
            0 => Content::SameWord(r.next()),
            1 => Content::Random(r.next()),
            2 => Content::Text(r.next()),
            _ => Content::Real(r.below(96) as usize),
        })
        .collect()
}

/// Random writes, reads, discards and compactions, a codec failure armed
/// before about one operation in three; returns (compress, decompress)
/// failures met.
fn run(algo: Algo, mode: Mode, seed: u64) -> (u64, u64) {
    let real = real_pages();
    let mut rig = rig(algo, mode);
    let mut r = Rng(seed);
    let (mut cf, mut df) = (0, 0);
    for i in 0..OPS {
        let why = format!("{algo} {mode:?} seed {seed:#x} op {i}");
        let first = r.below(PAGES);
        let n = 1 + r.below((PAGES - first).min(20));
        match r.below(8) {
            0..=3 => {
                if r.below(3) == 0 {
                    let calls = rig.plan.compress_calls.load(SeqCst);
                    rig.plan.compress_at.store(calls + 1 + r.below(4), SeqCst);
                    rig.plan.compress_how.store(r.below(3) as u8, SeqCst);
                }
                let data = contents(&mut r, n).into_iter().map(|c| page(c, &real));
                cf += rig.write(first, data.collect(), &why) as u64;
                rig.plan.compress_at.store(0, SeqCst);
            }
            4 | 5 => df += rig.read_failing(first, n, &why) as u64,
            6 => {
                rig.ctx
                    .discard(first * PAGE_SIZE as u64, n * PAGE_SIZE as u64)
                    .unwrap();
                for p in first..first + n {
                    rig.model[p as usize] = None;
                }
            }
            _ => {
                // The compactor's reads and writes meet failures too.
                let calls = rig.plan.decompress_calls.load(SeqCst);
                rig.plan.decompress_at.store(calls + 1, SeqCst);
                let calls = rig.plan.compress_calls.load(SeqCst);
                rig.plan.compress_at.store(calls + 2, SeqCst);
                rig.store.compact();
                rig.plan.decompress_at.store(0, SeqCst);
                rig.plan.compress_at.store(0, SeqCst);
                rig.plan.fired.store(false, SeqCst);
                rig.verify_all(&why);
            }
        }
    }
    rig.check_end(&format!("{algo} {mode:?} seed {seed:#x} end"));
    (cf, df)
}

#[test]
fn codec_failures_fail_one_request_and_never_store_or_serve_a_wrong_page() {
    let (mut cf, mut df) = (0, 0);
    for algo in [Algo::Lz4, Algo::Zstd(1), Algo::Deflate(1), Algo::None] {
        for mode in [Mode::PerPage, Mode::Packed] {
            for seed in [0xc0de_c0de_u64, 0xfa11_0001] {
                let (c, d) = run(algo, mode, seed);
                cf += c;
                df += d;
            }
        }
    }
    eprintln!("codec faults: {cf} compress failures, {df} decompress failures met");
    assert!(cf >= 50, "only {cf} compress failures were met");
    assert!(df >= 50, "only {df} decompress failures were met");
}
