//! Discard and fragmentation measurements: the engine-level twin of the
//! deferred-free patch's munmap benchmark, and the churn workload that
//! shows what compaction gives back.
//!
//! [`discard_bench`] fills two identical stores (one with deferred free,
//! one freeing immediately) with the same pages, then discards every page
//! from N threads on each, timing the discarding threads: the cost a
//! process exit or munmap of swapped-out memory puts on the I/O path.
//! [`churn_bench`] overwrites or discards a random half of a full store and
//! measures `mem_used_total / compr_data_size` before and after
//! compaction. Both take the pages as a byte slice (see
//! [`crate::engine::load_input`]) so the CLI, examples and tests share them.

use crate::{median, Error, Result};
use serde::Serialize;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use zblk::{Algo, AllocatorKind, Mode, Store, StoreConfig, StoreStats, PAGE_SIZE, PAGE_SIZE_U64};

/// What to run.
#[derive(Debug, Clone)]
pub struct DiscardOptions {
    /// Compression algorithm.
    pub algo: Algo,
    /// Pages per compression group.
    pub group_pages: usize,
    /// Threads discarding at once, each over its own share of the pages.
    pub discard_threads: usize,
    /// Pages per discard request.
    pub request_pages: usize,
    /// Times the input is stored back to back (to reach 64 MB to 1 GB from
    /// a smaller corpus).
    pub copies: usize,
    /// Rounds on fresh stores; the report gives the median of each figure.
    pub rounds: usize,
}

impl Default for DiscardOptions {
    fn default() -> Self {
        DiscardOptions {
            algo: Algo::Lz4,
            group_pages: zblk::DEFAULT_GROUP_PAGES,
            discard_threads: 1,
            request_pages: 16,
            copies: 1,
            rounds: 3,
        }
    }
}

/// Deferred against immediate free on the discarding threads.
#[derive(Debug, Clone, Serialize)]
pub struct DiscardReport {
    /// Pages stored and then discarded (per store).
    pub pages: u64,
    /// Discarding threads.
    pub discard_threads: usize,
    /// Pages per discard request.
    pub request_pages: usize,
    /// Median wall time of the slowest discarding thread, deferred free.
    pub discard_deferred_ms: f64,
    /// Median wall time of the slowest discarding thread, immediate free.
    pub discard_immediate_ms: f64,
    /// discard_immediate_ms / discard_deferred_ms.
    pub speedup: f64,
    /// Median time from the end of the deferred discards until the drain
    /// had freed everything.
    pub drain_settle_ms: f64,
    /// Bytes the deferred store's allocator held when full.
    pub mem_used_total_full: u64,
    /// Bytes still held by the deferred store once the drain settled (the
    /// worst round); an empty store holds `mem_used_total_empty`.
    pub mem_used_total_after: u64,
    /// Bytes still held by the immediate store after its discards.
    pub mem_used_total_after_immediate: u64,
    /// Bytes a freshly built, empty store's allocator holds.
    pub mem_used_total_empty: u64,
    /// Rounds run.
    pub rounds: usize,
}

fn store_for(data_len: usize, opts_algo: Algo, group: usize, deferred: bool) -> Result<Arc<Store>> {
    store_with(data_len, opts_algo, group, deferred, None, Mode::PerPage)
}

fn store_with(
    data_len: usize,
    opts_algo: Algo,
    group: usize,
    deferred: bool,
    huge_threshold: Option<usize>,
    mode: Mode,
) -> Result<Arc<Store>> {
    let mut cfg = StoreConfig::new(data_len as u64);
    cfg.mode = mode;
    if let Some(h) = huge_threshold {
        cfg.huge_threshold = h;
    }
    cfg.algo = opts_algo;
    cfg.group_pages = group;
    cfg.allocator = AllocatorKind::Slab;
    cfg.deferred_free = deferred;
    Ok(Store::new(cfg)?)
}

/// Writes `data` `copies` times back to back, 64 pages per request.
fn fill(store: &Arc<Store>, data: &[u8], copies: usize) -> Result<()> {
    let mut ctx = store.new_ctx();
    for c in 0..copies {
        let base = (c * data.len()) as u64;
        for (i, req) in data.chunks(64 * PAGE_SIZE).enumerate() {
            ctx.write(base + (i * 64 * PAGE_SIZE) as u64, req)?;
        }
    }
    Ok(())
}

/// Discards every page from `threads` threads, each over a contiguous
/// share; returns the slowest thread's wall time, from a common start to
/// its last request (partial batch handed on included).
fn discard_all(store: &Arc<Store>, pages: u64, threads: usize, req: usize) -> Result<Duration> {
    let per = pages.div_ceil(threads as u64);
    let barrier = Barrier::new(threads);
    let times: Vec<Result<Duration>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads as u64)
            .map(|t| {
                let (store, barrier) = (store.clone(), &barrier);
                s.spawn(move || {
                    let mut ctx = store.new_ctx();
                    let (first, end) = ((t * per).min(pages), ((t + 1) * per).min(pages));
                    barrier.wait();
                    let t0 = Instant::now();
                    let mut p = first;
                    while p < end {
                        let n = (req as u64).min(end - p);
                        ctx.discard(p * PAGE_SIZE_U64, n * PAGE_SIZE_U64)?;
                        p += n;
                    }
                    ctx.flush_frees();
                    Ok(t0.elapsed())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or(Err(Error::Panicked("discard"))))
            .collect()
    });
    let mut slowest = Duration::ZERO;
    for t in times {
        slowest = slowest.max(t?);
    }
    Ok(slowest)
}

fn check_input(data: &[u8], threads: usize, req: usize, copies: usize) -> Result<()> {
    if data.is_empty() || data.len() % PAGE_SIZE != 0 {
        return Err(Error::Input(
            "input must be a non-zero whole number of 4096-byte pages".into(),
        ));
    }
    if threads == 0 || req == 0 || copies == 0 {
        return Err(Error::Input(
            "threads, request pages and copies must be at least 1".into(),
        ));
    }
    Ok(())
}

/// Fills two identical stores (deferred and immediate free) and discards
/// every page from `discard_threads` threads on each, `rounds` times on
/// fresh stores, alternating which mode goes first.
pub fn discard_bench(opts: &DiscardOptions, data: &[u8]) -> Result<DiscardReport> {
    check_input(data, opts.discard_threads, opts.request_pages, opts.copies)?;
    let len = data.len() * opts.copies;
    let pages = (len / PAGE_SIZE) as u64;
    let empty = store_for(len, opts.algo, opts.group_pages, true)?
        .stats()
        .mem_used_total;
    let (mut deferred, mut immediate, mut settle) = (Vec::new(), Vec::new(), Vec::new());
    let (mut full, mut after, mut after_imm) = (0, 0, 0);
    for round in 0..opts.rounds.max(1) {
        let d = store_for(len, opts.algo, opts.group_pages, true)?;
        let i = store_for(len, opts.algo, opts.group_pages, false)?;
        fill(&d, data, opts.copies)?;
        fill(&i, data, opts.copies)?;
        full = d.stats().mem_used_total;
        let run = |s: &Arc<Store>| discard_all(s, pages, opts.discard_threads, opts.request_pages);
        // The drain settles before the immediate run starts, so that it
        // never competes with it for the CPUs.
        let run_deferred = || -> Result<(Duration, Duration)> {
            let td = run(&d)?;
            let t0 = Instant::now();
            d.settle_frees(Duration::from_secs(60));
            Ok((td, t0.elapsed()))
        };
        let ((td, ts), ti) = if round % 2 == 0 {
            let dd = run_deferred()?;
            (dd, run(&i)?)
        } else {
            let ti = run(&i)?;
            (run_deferred()?, ti)
        };
        settle.push(ts.as_secs_f64() * 1e3);
        deferred.push(td.as_secs_f64() * 1e3);
        immediate.push(ti.as_secs_f64() * 1e3);
        after = after.max(d.stats().mem_used_total);
        after_imm = after_imm.max(i.stats().mem_used_total);
    }
    let (dm, im) = (median(deferred), median(immediate));
    Ok(DiscardReport {
        pages,
        discard_threads: opts.discard_threads,
        request_pages: opts.request_pages,
        discard_deferred_ms: dm,
        discard_immediate_ms: im,
        speedup: im / dm.max(1e-9),
        drain_settle_ms: median(settle),
        mem_used_total_full: full,
        mem_used_total_after: after,
        mem_used_total_after_immediate: after_imm,
        mem_used_total_empty: empty,
        rounds: opts.rounds.max(1),
    })
}

/// Memory against data before and after compaction, after churn.
#[derive(Debug, Clone, Serialize)]
pub struct ChurnReport {
    /// Pages stored before the churn.
    pub pages: u64,
    /// orig_data_size / mem_used_total of the full store, before churn (the
    /// allocator's overhead; kernel zram with lz4 reaches 2.75 on the
    /// corpus).
    pub ratio_mem_full: f64,
    /// orig_data_size / compr_data_size of the full store.
    pub ratio_data_full: f64,
    /// mem_used_total / compr_data_size of the full store.
    pub frag_full: f64,
    /// Pages overwritten with another page of the input.
    pub overwritten: u64,
    /// Pages discarded.
    pub discarded: u64,
    /// mem_used_total / compr_data_size after churn, before compaction.
    pub frag_before_compact: f64,
    /// mem_used_total / compr_data_size after compaction.
    pub frag_after_compact: f64,
    /// Pages compaction gave back.
    pub pages_compacted: u64,
    /// Milliseconds `compact()` took.
    pub compact_ms: f64,
    /// Pages that did not read back as expected after compaction (must be 0).
    pub verify_errors: u64,
}

/// What the churn measurement runs.
#[derive(Debug, Clone)]
pub struct ChurnOptions {
    /// Compression algorithm.
    pub algo: Algo,
    /// Times the input is stored back to back.
    pub copies: usize,
    /// Seed of the random choice of pages to churn.
    pub seed: u64,
    /// Compressed size at or above which a page is stored raw (None: the
    /// store's default).
    pub huge_threshold: Option<usize>,
    /// How groups are stored (per page or packed).
    pub mode: Mode,
}

impl Default for ChurnOptions {
    fn default() -> Self {
        ChurnOptions {
            algo: Algo::Lz4,
            copies: 1,
            seed: 0x5eed,
            huge_threshold: None,
            mode: Mode::PerPage,
        }
    }
}

/// Fills a store with `data` `copies` times, overwrites (with another page
/// of the input) or discards a random half of the pages, lets the frees
/// settle, and measures fragmentation before and after `compact()`. The
/// store has deferred free and its own automatic compaction, which may
/// already have run by the time `frag_before_compact` is read: that figure
/// is what a user would see.
pub fn churn_bench(opts: &ChurnOptions, data: &[u8]) -> Result<ChurnReport> {
    check_input(data, 1, 1, opts.copies)?;
    let len = data.len() * opts.copies;
    let pages = len / PAGE_SIZE;
    let group = zblk::DEFAULT_GROUP_PAGES;
    let s = store_with(len, opts.algo, group, true, opts.huge_threshold, opts.mode)?;
    fill(&s, data, opts.copies)?;
    let st = s.stats();
    let frag =
        |st: &StoreStats| st.mem_used_total as f64 / st.counters.compr_data_size.max(1) as f64;
    let ratio = |den: u64| st.counters.orig_data_size as f64 / den.max(1) as f64;
    let (ratio_mem_full, ratio_data_full, frag_full) = (
        ratio(st.mem_used_total),
        ratio(st.counters.compr_data_size),
        frag(&st),
    );
    // expect[p]: which input page slot p should now hold (None: discarded).
    let src_pages = data.len() / PAGE_SIZE;
    let mut expect: Vec<Option<usize>> = (0..pages).map(|p| Some(p % src_pages)).collect();
    let mut ctx = s.new_ctx();
    let mut x = opts.seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut overwritten, mut discarded) = (0, 0);
    for (p, e) in expect.iter_mut().enumerate() {
        if next() % 2 == 0 {
            continue;
        }
        let off = (p * PAGE_SIZE) as u64;
        if next() % 2 == 0 {
            let q = (next() % src_pages as u64) as usize;
            ctx.write(off, &data[q * PAGE_SIZE..(q + 1) * PAGE_SIZE])?;
            *e = Some(q);
            overwritten += 1;
        } else {
            ctx.discard(off, PAGE_SIZE_U64)?;
            *e = None;
            discarded += 1;
        }
    }
    ctx.flush_frees();
    s.settle_frees(Duration::from_secs(60));
    let before = s.stats();
    let t0 = Instant::now();
    let compacted = s.compact();
    let compact_ms = t0.elapsed().as_secs_f64() * 1e3;
    let after = s.stats();
    let mut buf = vec![0u8; PAGE_SIZE];
    let mut verify_errors = 0;
    for (p, e) in expect.iter().enumerate() {
        ctx.read((p * PAGE_SIZE) as u64, &mut buf)?;
        let ok = match e {
            Some(q) => buf[..] == data[q * PAGE_SIZE..(q + 1) * PAGE_SIZE],
            None => buf.iter().all(|&b| b == 0),
        };
        verify_errors += u64::from(!ok);
    }
    Ok(ChurnReport {
        pages: pages as u64,
        ratio_mem_full,
        ratio_data_full,
        frag_full,
        overwritten,
        discarded,
        frag_before_compact: frag(&before),
        frag_after_compact: frag(&after),
        pages_compacted: compacted,
        compact_ms,
        verify_errors,
    })
}
