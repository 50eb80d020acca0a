//! Allocation-failure injection: every failure point of the engine
//! (`zblk::testing::faults::POINTS`, listed in docs/fault-injection.md),
//! for per-page and packed stores on the heap allocator, the slab and the
//! slab in shared memory, armed for one pass in a random workload checked
//! against a model.
//!
//! For each configuration a dry run counts the passes through each point;
//! then the same workload runs again with the point armed for one chosen
//! pass. What must hold:
//! - the request that met the failure got `Error::NoSpace` (ENOSPC, what
//!   the daemon answers a full device with); a compaction that met it
//!   returns normally (the page stays where it was);
//! - a failed write is cut at a compression group: the groups before the
//!   one that failed hold the new data, the failed group and every group
//!   after it keep their OLD content, whole (never a mix within a group);
//! - every other page reads back exactly as the model says;
//! - stored/same pages (and, per page, compressed bytes and huge pages)
//!   equal a recount from the model, with the engine's own codec;
//! - after discarding everything, every gauge and `mem_used_total` is 0,
//!   and the heap allocator holds no live object (no leak).
//!
//! By default a sample of passes is armed per point (first, last and six
//! chosen by the seed); `ZBLK_FAULTS_FULL=1` arms every pass.

mod common;

use common::{page, real_pages, same_filled, Content, Rng};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zblk::alloc::{AllocError, Handle, HeapAllocator, MemAccount, ObjAllocator};
use zblk::testing::faults;
use zblk::{
    Algo, AllocatorKind, Error, Mode, QueueCtx, Store, StoreConfig, DEFAULT_HUGE_THRESHOLD,
    PAGE_SIZE,
};

const PAGES: u64 = 64;
const OPS: usize = 80;
const GROUP: u64 = 8;
const SEED: u64 = 0x5eed_fa17;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Backing {
    Heap,
    Slab,
    Shared,
}

#[derive(Debug, Clone)]
enum Op {
    Write { page: u64, contents: Vec<Content> },
    Discard { page: u64, n: u64 },
    Compact,
}

/// The workload: writes of 1..=20 pages of every kind of content (so that
/// requests span groups), discards that leave packed groups sparse, and
/// compactions that rewrite them.
fn workload(seed: u64) -> Vec<Op> {
    let mut r = Rng(seed);
    (0..OPS)
        .map(|i| {
            if i % 16 == 15 {
                return Op::Compact;
            }
            let page = r.below(PAGES);
            let n = 1 + r.below((PAGES - page).min(20));
            if r.below(4) == 0 {
                return Op::Discard { page, n };
            }
            let contents = (0..n)
                .map(|_| match r.below(6) {
                    0 => Content::Zeros,
                    1 => Content::SameWord(r.next()),
                    2 => Content::Random(r.next()),
                    3 => Content::Text(r.next()),
                    _ => Content::Real(r.below(96) as usize),
                })
                .collect();
            Op::Write { page, contents }
        })
        .collect()
}

/// Delegates to a shared heap allocator, so the test can count its live
/// objects while the store owns it.
struct Spy(Arc<HeapAllocator>);

impl ObjAllocator for Spy {
    fn alloc_bulk(&self, s: &[u32], o: &[u64], out: &mut Vec<Handle>) -> Result<(), AllocError> {
        self.0.alloc_bulk(s, o, out)
    }

    fn free_bulk(&self, handles: &[Handle]) {
        self.0.free_bulk(handles)
    }

    unsafe fn object_ptr(&self, h: Handle, len: usize) -> *mut u8 {
        // SAFETY: the caller's contract is the heap allocator's.
        unsafe { self.0.object_ptr(h, len) }
    }

    fn mem(&self) -> &MemAccount {
        self.0.mem()
    }
}

struct Rig {
    store: Arc<Store>,
    ctx: QueueCtx,
    heap: Option<Arc<HeapAllocator>>,
    model: Vec<Option<Vec<u8>>>,
    mode: Mode,
}

fn rig(mode: Mode, backing: Backing) -> Rig {
    let mut cfg = StoreConfig::new(PAGES * PAGE_SIZE as u64);
    cfg.mode = mode;
    cfg.group_pages = GROUP as usize;
    cfg.algo = Algo::Lz4;
    // Frees on this thread: the passes are the same in every run.
    cfg.deferred_free = false;
    cfg.shared = backing == Backing::Shared;
    let (store, heap) = match backing {
        Backing::Heap => {
            cfg.allocator = AllocatorKind::Heap;
            let heap = Arc::new(HeapAllocator::new());
            let store = Store::with_allocator(cfg, Box::new(Spy(heap.clone()))).unwrap();
            (store, Some(heap))
        }
        Backing::Slab | Backing::Shared => (Store::new(cfg).unwrap(), None),
    };
    Rig {
        ctx: store.new_ctx(),
        store,
        heap,
        model: vec![None; PAGES as usize],
        mode,
    }
}

fn read(ctx: &mut QueueCtx, p: u64) -> Vec<u8> {
    let mut buf = vec![0u8; PAGE_SIZE];
    ctx.read(p * PAGE_SIZE as u64, &mut buf).unwrap();
    buf
}

fn expected(model: &[Option<Vec<u8>>], p: u64) -> Vec<u8> {
    model[p as usize]
        .clone()
        .unwrap_or_else(|| vec![0; PAGE_SIZE])
}

impl Rig {
    fn verify_all(&mut self, why: &str) {
        for p in 0..PAGES {
            assert!(
                read(&mut self.ctx, p) == expected(&self.model, p),
                "{why}: page {p} differs from the model"
            );
        }
    }

    /// After a write that failed in its group `done` (the store's `groups`
    /// counter says how many it stored): the groups before hold the new
    /// data, that group and the rest keep the old content, each whole.
    fn settle_failed_write(&mut self, first: u64, data: &[Vec<u8>], done: u64, why: &str) {
        let groups = data.len().div_ceil(GROUP as usize) as u64;
        assert!(done < groups, "{why}: {done} of {groups} groups stored");
        for (g, chunk) in data.chunks(GROUP as usize).enumerate() {
            let at = first + g as u64 * GROUP;
            for (i, d) in chunk.iter().enumerate() {
                let p = at + i as u64;
                if (g as u64) < done {
                    self.model[p as usize] = Some(d.clone());
                }
                assert!(
                    read(&mut self.ctx, p) == expected(&self.model, p),
                    "{why}: page {p} (group {g}, {done} stored) is not {}",
                    if (g as u64) < done { "new" } else { "old" }
                );
            }
        }
    }

    /// Gauges against a recount from the model.
    fn check_stats(&self, why: &str) {
        let c = self.store.stats().counters;
        let stored: Vec<&Vec<u8>> = self.model.iter().flatten().collect();
        let same = stored.iter().filter(|p| same_filled(p)).count() as u64;
        assert_eq!(c.stored_pages, stored.len() as u64, "{why}: stored_pages");
        assert_eq!(c.same_pages, same, "{why}: same_pages");
        if self.mode == Mode::PerPage {
            let mut codec = Algo::Lz4.new_codec();
            let mut dst = vec![0u8; DEFAULT_HUGE_THRESHOLD - 1];
            let (mut bytes, mut huge) = (0u64, 0u64);
            for p in stored.iter().filter(|p| !same_filled(p)) {
                match codec.compress(p, &mut dst).unwrap() {
                    Some(n) => bytes += n as u64,
                    None => {
                        bytes += PAGE_SIZE as u64;
                        huge += 1;
                    }
                }
            }
            assert_eq!(c.compr_data_size, bytes, "{why}: compr_data_size");
            assert_eq!(c.huge_pages, huge, "{why}: huge_pages");
        }
    }

    /// Discards everything: nothing may be left stored, charged or live.
    fn check_empty_after_discard(&mut self, why: &str) {
        self.ctx.discard(0, PAGES * PAGE_SIZE as u64).unwrap();
        self.ctx.flush_frees();
        let s = self.store.stats();
        assert_eq!(s.counters.stored_pages, 0, "{why}: stored after discard");
        assert_eq!(s.counters.compr_data_size, 0, "{why}: compr after discard");
        assert_eq!(s.counters.huge_pages, 0, "{why}: huge after discard");
        assert_eq!(s.counters.packed_dead_bytes, 0, "{why}: dead bytes");
        assert_eq!(s.mem_used_total, 0, "{why}: memory still charged (leak)");
        if let Some(h) = &self.heap {
            assert_eq!(h.live_objects(), 0, "{why}: heap objects leaked");
        }
    }
}

/// Runs the workload; with `arm`, that point fails on that pass. Returns
/// the passes through every point (dry run) and whether the point fired.
fn run(mode: Mode, backing: Backing, arm: Option<(&str, u64)>) -> (Vec<u64>, bool) {
    let real = real_pages();
    let mut rig = rig(mode, backing);
    let base: Vec<u64> = faults::POINTS.iter().map(|p| faults::passes(p)).collect();
    if let Some((point, nth)) = arm {
        assert!(faults::arm(point, nth));
    }
    let why = format!("{mode:?} {backing:?} {arm:?}");
    let mut fired_any = false;
    for (i, op) in workload(SEED).into_iter().enumerate() {
        let why = format!("{why} op {i} {op:?}");
        let fired = match op {
            Op::Write {
                page: first,
                contents,
            } => {
                let data: Vec<Vec<u8>> = contents.iter().map(|&c| page(c, &real)).collect();
                let groups = rig.store.stats().counters.groups;
                let r = rig.ctx.write(first * PAGE_SIZE as u64, &data.concat());
                let fired = faults::take_fired();
                match r {
                    Ok(()) => {
                        assert!(!fired, "{why}: the failure was swallowed");
                        for (k, d) in data.into_iter().enumerate() {
                            rig.model[first as usize + k] = Some(d);
                        }
                    }
                    Err(e) => {
                        assert!(fired, "{why}: failed with no fault: {e}");
                        assert!(matches!(e, Error::NoSpace { .. }), "{why}: {e:?}");
                        assert_eq!(e.errno(), -libc::ENOSPC, "{why}");
                        let done = rig.store.stats().counters.groups - groups;
                        rig.settle_failed_write(first, &data, done, &why);
                    }
                }
                fired
            }
            Op::Discard { page, n } => {
                rig.ctx
                    .discard(page * PAGE_SIZE as u64, n * PAGE_SIZE as u64)
                    .unwrap();
                for p in page..page + n {
                    rig.model[p as usize] = None;
                }
                faults::take_fired()
            }
            Op::Compact => {
                rig.store.compact();
                faults::take_fired()
            }
        };
        if fired {
            fired_any = true;
            rig.verify_all(&why);
            rig.check_stats(&why);
        }
    }
    faults::disarm();
    rig.verify_all(&why);
    rig.check_stats(&why);
    rig.check_empty_after_discard(&why);
    let passes = faults::POINTS
        .iter()
        .zip(&base)
        .map(|(p, b)| faults::passes(p) - b)
        .collect();
    (passes, fired_any)
}

/// The passes to arm out of `n`: all of them, or first, last and six more.
fn chosen(n: u64, full: bool, r: &mut Rng) -> Vec<u64> {
    if full || n <= 4 {
        return (1..=n).collect();
    }
    let mut v: Vec<u64> = (0..6).map(|_| 2 + r.below(n - 2)).collect();
    v.extend([1, n]);
    v.sort_unstable();
    v.dedup();
    v
}

#[test]
fn every_allocation_failure_point_fails_one_request_cleanly() {
    let full = std::env::var("ZBLK_FAULTS_FULL").is_ok_and(|v| v == "1");
    let t0 = Instant::now();
    let mut reached = vec![false; faults::POINTS.len()];
    let (mut cases, mut fired) = (0, 0);
    let mut r = Rng(SEED);
    for mode in [Mode::PerPage, Mode::Packed] {
        for backing in [Backing::Heap, Backing::Slab, Backing::Shared] {
            let (passes, _) = run(mode, backing, None);
            for (i, point) in faults::POINTS.iter().enumerate() {
                reached[i] |= passes[i] > 0;
                for nth in chosen(passes[i], full, &mut r) {
                    let (_, f) = run(mode, backing, Some((point, nth)));
                    cases += 1;
                    fired += f as u64;
                }
            }
        }
    }
    for (i, point) in faults::POINTS.iter().enumerate() {
        assert!(reached[i], "failure point {point} is never reached");
    }
    assert_eq!(fired, cases, "every armed pass must fire");
    eprintln!(
        "{} failure points, {cases} cases, {:.1} s{}",
        faults::POINTS.len(),
        t0.elapsed().as_secs_f64(),
        if full { " (full)" } else { " (sampled)" }
    );
    assert!(t0.elapsed() < Duration::from_secs(600));
}
