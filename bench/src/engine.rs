//! `zblk bench`: the engine run over a file of pages, without a kernel.
//!
//! Writes every 4 KB page of the input into a store sized for it, reads
//! every page back and compares, and reports ratios, throughput and
//! per-page latency. The CLI parses arguments and prints; this module does
//! the work so that tests and criterion benches can call it too.

use crate::{Error, Result};
use serde::Serialize;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use zblk::{Algo, Mode, QueueCtx, Store, StoreConfig, StoreStats, PAGE_SIZE};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Compression algorithm.
    pub algo: Algo,
    /// Pages per compression group.
    pub group_pages: usize,
    /// Threads, each with its own context, splitting the pages.
    pub threads: usize,
    /// Pages per write and read request.
    pub request_pages: usize,
    /// Per-page or packed objects.
    pub mode: Mode,
    /// Keep the store in shared memory (recoverable after a crash).
    pub shared: bool,
    /// Keep a memory reserve (the daemon's setting, `StoreConfig::reserve`).
    pub reserve: bool,
    /// `StoreConfig::reserve_free_below` (0: the daemon's automatic one).
    pub reserve_free_below: u64,
    /// Lock the store in RAM, as a swap device's daemon does.
    pub mlock: bool,
    /// With `shared`: 2 MB pages for the slab's larger chunks where the
    /// system gives them (`StoreConfig::huge_pages`).
    pub huge_pages: bool,
    /// Compression workers (`StoreConfig::compress_workers`; 0: none).
    pub compress_workers: usize,
}

/// What `zblk bench --json` prints: exactly these keys.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Pages in the input.
    pub pages: u64,
    /// Pages that did not read back identical (must be 0).
    pub verify_errors: u64,
    /// orig_data_size / compr_data_size.
    pub ratio_data: f64,
    /// orig_data_size / mem_used_total.
    pub ratio_mem: f64,
    /// Write throughput, MB/s of uncompressed data.
    pub write_mb_s: f64,
    /// Read throughput, MB/s of uncompressed data.
    pub read_mb_s: f64,
    /// Median per-page write latency, microseconds.
    pub write_p50_us: f64,
    /// 99th percentile per-page write latency, microseconds.
    pub write_p99_us: f64,
    /// Median per-page read latency, microseconds.
    pub read_p50_us: f64,
    /// 99th percentile per-page read latency, microseconds.
    pub read_p99_us: f64,
    /// Algorithm name.
    pub algo: String,
    /// Pages per group.
    pub group_pages: usize,
    /// Threads.
    pub threads: usize,
    /// Per-page or packed objects.
    pub mode: String,
    /// The store: `daemon` (shared memory, reserve, mlock, as the daemon
    /// runs it), `private`, or `custom` for another mix.
    pub store: &'static str,
    /// Compression workers.
    pub compress_workers: usize,
    /// CPU time of the whole process (every thread: submitters, workers,
    /// the reserve, the drain) per page written, microseconds.
    pub write_cpu_us_per_page: f64,
    /// The same per page read.
    pub read_cpu_us_per_page: f64,
    /// Median time of one write request (`request_pages` pages), µs.
    pub write_request_p50_us: f64,
    /// Median time of one read request, µs.
    pub read_request_p50_us: f64,
    /// Write groups that ran on a compression worker, of `groups`.
    pub worker_groups: u64,
    /// Write groups in all.
    pub groups: u64,
    /// Read groups that ran on a compression worker.
    pub worker_read_groups: u64,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            algo: Algo::Lz4,
            group_pages: zblk::DEFAULT_GROUP_PAGES,
            threads: 1,
            request_pages: DEFAULT_REQUEST_PAGES,
            mode: Mode::PerPage,
            shared: false,
            reserve: false,
            reserve_free_below: 0,
            mlock: false,
            huge_pages: false,
            compress_workers: 0,
        }
    }
}

impl BenchOptions {
    /// The store as the daemon runs it (`zblk_ublk::DeviceConfig::store_config`):
    /// in shared memory (recoverable), with the memory reserve and its
    /// provisioner, locked in RAM. What `zblk bench` measures by default.
    pub fn daemon() -> Self {
        BenchOptions {
            shared: true,
            reserve: true,
            mlock: true,
            ..BenchOptions::default()
        }
    }

    /// What [`BenchReport::store`] calls this store.
    pub fn store_name(&self) -> &'static str {
        match (self.shared, self.reserve, self.mlock) {
            (true, true, true) if !self.huge_pages => "daemon",
            (false, false, false) => "private",
            _ => "custom",
        }
    }

    /// The configuration of a store of `size` bytes as these options say.
    pub fn store_config(&self, size: u64) -> StoreConfig {
        let mut cfg = StoreConfig::new(size);
        cfg.algo = self.algo;
        cfg.group_pages = self.group_pages;
        cfg.mode = self.mode;
        cfg.shared = self.shared;
        cfg.reserve = self.reserve;
        cfg.reserve_free_below = self.reserve_free_below;
        cfg.mlock = self.mlock;
        cfg.huge_pages = self.huge_pages;
        cfg.compress_workers = self.compress_workers;
        cfg
    }
}

/// Pages per write/read request in the bench: 64 KB, a typical swap-out of
/// a 16-page large folio.
pub const DEFAULT_REQUEST_PAGES: usize = 16;

/// Reads a bench input: a file of pages, decompressed on the fly when its
/// name ends in `.zst`. A trailing partial page is zero-padded.
pub fn load_input(path: &Path) -> Result<Vec<u8>> {
    let shown = path.display();
    let raw = std::fs::read(path).map_err(|e| Error::Input(format!("cannot read {shown}: {e}")))?;
    let mut data = if path.extension().is_some_and(|e| e == "zst") {
        zstd::stream::decode_all(&raw[..])
            .map_err(|e| Error::Input(format!("cannot decompress {shown} as zstd: {e}")))?
    } else {
        raw
    };
    if data.is_empty() {
        return Err(Error::Input(format!("{shown} is empty: nothing to store")));
    }
    let rem = data.len() % PAGE_SIZE;
    if rem != 0 {
        data.resize(data.len() + PAGE_SIZE - rem, 0);
    }
    Ok(data)
}

/// Runs the bench over `data` (a whole number of pages).
pub fn run(opts: &BenchOptions, data: &[u8]) -> Result<BenchReport> {
    if data.is_empty() || data.len() % PAGE_SIZE != 0 {
        return Err(Error::Input(
            "bench input must be a non-zero whole number of 4096-byte pages".into(),
        ));
    }
    if opts.threads == 0 || opts.request_pages == 0 {
        return Err(Error::Input(
            "threads and request pages must be at least 1".into(),
        ));
    }
    let store = Store::new(opts.store_config(data.len() as u64))?;
    let write = run_phase(&store, data, opts, Phase::Write)?;
    let read = run_phase(&store, data, opts, Phase::Read)?;
    Ok(report(opts, &store.stats(), data.len(), &write, &read))
}

/// What one phase measured.
struct PhaseResult {
    /// Wall time of the slowest thread, seconds.
    secs: f64,
    /// Pages that did not verify.
    bad: u64,
    /// CPU seconds of the whole process over the phase.
    cpu_s: f64,
    /// Median request time, seconds.
    request_p50_s: f64,
}

/// CPU time (user and system) of every thread of this process, seconds.
fn process_cpu_s() -> f64 {
    // SAFETY: getrusage fills the plain C struct it is given; zeroed is a
    // valid value for it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF covers every thread of the process.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

#[derive(Clone, Copy, PartialEq)]
enum Phase {
    Write,
    Read,
}

/// Runs one phase on `opts.threads` threads, each with its own context;
/// returns the wall time of the slowest thread and the pages that did not
/// verify.
///
/// Requests are dealt out round-robin (thread `t` takes requests `t`,
/// `t + threads`, ...), not as contiguous shares: real memory is not
/// uniform (the second half of the corpus compresses 1.5x slower than the
/// first), so contiguous halves would leave one thread idle at the end and
/// measure the imbalance instead of the engine's scaling.
fn run_phase(
    store: &Arc<Store>,
    data: &[u8],
    opts: &BenchOptions,
    phase: Phase,
) -> Result<PhaseResult> {
    let requests = data.len().div_ceil(opts.request_pages * PAGE_SIZE);
    let threads = opts.threads.min(requests).max(1);
    let barrier = Barrier::new(threads);
    let cpu0 = process_cpu_s();
    let results: Vec<Result<ShareResult>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let store = store.clone();
                let barrier = &barrier;
                s.spawn(move || {
                    let mut ctx = store.new_ctx();
                    barrier.wait();
                    let share = Share {
                        first: t,
                        stride: threads,
                        req_pages: opts.request_pages,
                    };
                    let r = run_share(&mut ctx, data, share, phase);
                    ctx.flush_frees();
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(Error::Panicked("bench"))))
            .collect()
    });
    let cpu_s = process_cpu_s() - cpu0;
    let mut slowest = 0.0f64;
    let mut bad = 0;
    let mut times = Vec::with_capacity(requests);
    for r in results {
        let r = r?;
        slowest = slowest.max(r.busy_s);
        bad += r.bad;
        times.extend(r.request_s);
    }
    Ok(PhaseResult {
        secs: slowest,
        bad,
        cpu_s,
        request_p50_s: crate::median(times),
    })
}

/// What one thread's share measured.
struct ShareResult {
    /// Time in store calls, seconds.
    busy_s: f64,
    /// Pages that did not verify.
    bad: u64,
    /// Each request's time, seconds.
    request_s: Vec<f64>,
}

/// Which requests one thread runs: every `stride`-th from `first`.
#[derive(Clone, Copy)]
struct Share {
    first: usize,
    stride: usize,
    req_pages: usize,
}

/// Writes, or reads and compares, one thread's share request by request.
/// Only the store calls are timed: a read request lands in one reused
/// buffer (as in a ublk queue's I/O buffer) and is compared untimed.
fn run_share(ctx: &mut QueueCtx, data: &[u8], share: Share, phase: Phase) -> Result<ShareResult> {
    let req_bytes = share.req_pages * PAGE_SIZE;
    let mut buf = vec![0u8; req_bytes];
    let mut busy = Duration::ZERO;
    let mut bad = 0u64;
    let mut request_s = Vec::with_capacity(data.len() / req_bytes / share.stride + 1);
    let mine = data
        .chunks(req_bytes)
        .enumerate()
        .skip(share.first)
        .step_by(share.stride);
    for (i, req) in mine {
        let off = (i * req_bytes) as u64;
        let out = &mut buf[..req.len()];
        let t0 = Instant::now();
        match phase {
            Phase::Write => ctx.write(off, req)?,
            Phase::Read => ctx.read(off, out)?,
        }
        let took = t0.elapsed();
        busy += took;
        request_s.push(took.as_secs_f64());
        if phase == Phase::Read {
            bad += req
                .chunks_exact(PAGE_SIZE)
                .zip(out.chunks_exact(PAGE_SIZE))
                .filter(|(a, b)| a != b)
                .count() as u64;
        }
    }
    Ok(ShareResult {
        busy_s: busy.as_secs_f64(),
        bad,
        request_s,
    })
}

fn report(
    opts: &BenchOptions,
    st: &StoreStats,
    bytes: usize,
    write: &PhaseResult,
    read: &PhaseResult,
) -> BenchReport {
    let mb = bytes as f64 / 1e6;
    let pages = (bytes / PAGE_SIZE) as f64;
    let (write_s, read_s) = (write.secs, read.secs);
    let ratio = |den: u64| {
        if den == 0 {
            0.0
        } else {
            st.counters.orig_data_size as f64 / den as f64
        }
    };
    BenchReport {
        pages: (bytes / PAGE_SIZE) as u64,
        verify_errors: read.bad,
        ratio_data: ratio(st.counters.compr_data_size),
        ratio_mem: ratio(st.mem_used_total),
        write_mb_s: mb / write_s.max(1e-9),
        read_mb_s: mb / read_s.max(1e-9),
        write_p50_us: st.latency.write.p50_us,
        write_p99_us: st.latency.write.p99_us,
        read_p50_us: st.latency.read.p50_us,
        read_p99_us: st.latency.read.p99_us,
        algo: opts.algo.to_string(),
        group_pages: opts.group_pages,
        threads: opts.threads,
        mode: opts.mode.to_string(),
        store: opts.store_name(),
        compress_workers: opts.compress_workers,
        write_cpu_us_per_page: write.cpu_s * 1e6 / pages,
        read_cpu_us_per_page: read.cpu_s * 1e6 / pages,
        write_request_p50_us: write.request_p50_s * 1e6,
        read_request_p50_us: read.request_p50_s * 1e6,
        worker_groups: st.counters.worker_groups,
        groups: st.counters.groups,
        worker_read_groups: st.counters.worker_read_groups,
    }
}

/// The bare codec on the same pages, one thread, no store: the ceiling the
/// store path is measured against. Pages are compressed one at a time into a
/// reused buffer and decompressed back; same-filled pages are skipped, as the
/// store skips them.
pub fn codec_ceiling(algo: Algo, data: &[u8]) -> Result<CodecCeiling> {
    let mut codec = algo.new_codec();
    let budget = zblk::DEFAULT_HUGE_THRESHOLD - 1;
    // Compressed pages are kept back to back in one arena, written once
    // before the clock starts, so the ceiling pays no allocation and no
    // first-touch page fault: only the codec and one copy per page.
    let mut arena = vec![1u8; data.len()];
    let mut objs: Vec<Option<(usize, usize)>> = Vec::with_capacity(data.len() / PAGE_SIZE);
    let mut area = vec![0u8; PAGE_SIZE];
    let mut end = 0;
    let t0 = Instant::now();
    for page in data.chunks_exact(PAGE_SIZE) {
        if same_filled(page) {
            objs.push(None);
            continue;
        }
        let kept = match codec
            .compress(page, &mut area[..budget])
            .map_err(zblk::Error::from)?
        {
            Some(n) => {
                arena[end..end + n].copy_from_slice(&area[..n]);
                end += n;
                Some((end - n, n))
            }
            None => None,
        };
        objs.push(kept);
    }
    let compress_s = t0.elapsed().as_secs_f64();
    let mut out = vec![0u8; PAGE_SIZE];
    let t0 = Instant::now();
    for (obj, page) in objs.iter().zip(data.chunks_exact(PAGE_SIZE)) {
        match obj {
            Some((at, n)) => codec
                .decompress(&arena[*at..at + n], &mut out)
                .map_err(zblk::Error::from)?,
            None => out.copy_from_slice(page),
        }
    }
    let decompress_s = t0.elapsed().as_secs_f64();
    let mb = data.len() as f64 / 1e6;
    Ok(CodecCeiling {
        compress_mb_s: mb / compress_s.max(1e-9),
        decompress_mb_s: mb / decompress_s.max(1e-9),
    })
}

/// Throughput of the bare codec, MB/s of uncompressed data.
#[derive(Debug, Clone, Serialize)]
pub struct CodecCeiling {
    /// Compression throughput.
    pub compress_mb_s: f64,
    /// Decompression throughput.
    pub decompress_mb_s: f64,
}

/// Whether `page` is one 8-byte word repeated, a page the store keeps as
/// that word and never compresses.
pub fn same_filled(page: &[u8]) -> bool {
    let mut words = page.chunks_exact(8);
    words.next().is_some_and(|w| words.all(|x| x == w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_filled_pages_are_one_word_repeated() {
        assert!(same_filled(&[0u8; PAGE_SIZE]));
        let word = 0x0102_0304_0506_0708u64.to_ne_bytes();
        let page: Vec<u8> = word.iter().copied().cycle().take(PAGE_SIZE).collect();
        assert!(same_filled(&page));
        let mut other = page.clone();
        other[PAGE_SIZE - 1] ^= 1;
        assert!(!same_filled(&other));
    }

    #[test]
    fn bad_options_and_inputs_are_input_errors() {
        let opts = BenchOptions::default();
        assert!(matches!(run(&opts, &[]), Err(Error::Input(_))));
        assert!(matches!(run(&opts, &[0u8; 100]), Err(Error::Input(_))));
        let zero = BenchOptions {
            threads: 0,
            ..opts.clone()
        };
        assert!(matches!(
            run(&zero, &[0u8; PAGE_SIZE]),
            Err(Error::Input(_))
        ));
        let missing = load_input(Path::new("/nonexistent/pages"));
        assert!(matches!(missing, Err(Error::Input(m)) if m.contains("cannot read")));
    }

    #[test]
    fn the_fixture_runs_and_verifies() {
        let data = load_input(&crate::fixture_path()).expect("the fixture loads");
        let rep = run(&BenchOptions::default(), &data).expect("bench runs");
        assert_eq!((rep.pages, rep.verify_errors), (96, 0));
        let ceil = codec_ceiling(Algo::Lz4, &data).expect("codec runs");
        assert!(ceil.compress_mb_s > 0.0 && ceil.decompress_mb_s > 0.0);
    }
}
