//! randio: random 4 KB direct I/O against a block device, IOPS and latency.
//!
//! A small fio-like loop of our own, so the qemu guest needs nothing beyond
//! the static binaries: it opens the device with `O_DIRECT` (the page cache
//! would otherwise answer reads and batch writes), optionally pre-fills the
//! first `--mb` MB with the compressible page pattern of the workload
//! programs (about 2.8:1 with lz4, so the device stores compressed objects,
//! not same-filled pages), then issues single 4 KB `pread`/`pwrite` calls at
//! random page offsets in that range, until `--count` operations or
//! `--seconds` have passed. `--jobs N` runs N threads, each issuing one
//! synchronous operation at a time (queue depth N); job j owns the pages
//! p with p % N == j, so that each job alone knows what its pages hold.
//!
//! Every write stores the pattern of a new generation for its page, and
//! every read is checked against the generation last written there, so a
//! lost or misplaced page fails the run (exit 1) instead of just being fast.
//! The result is one JSON object on stdout: IOPS, MB/s and per-operation
//! p50/p99/max latency (microseconds, wall clock around each system call),
//! over the operations of all jobs.
//!
//! `randio --dev /dev/ublkb0 --mb 64 --write-pct 0 --seconds 5 --prefill`

mod workload;

use clap::Parser;
use serde_json::{json, Value};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use workload::{fill_page, page_matches, r3, PAGE};

/// Command line of randio.
#[derive(Parser, Debug, Clone)]
#[command(about = "random 4 KB O_DIRECT reads/writes: IOPS and latency percentiles")]
struct Args {
    /// Block device (or file) to work on.
    #[arg(long)]
    dev: PathBuf,
    /// MB at the start of the device the random offsets fall into.
    #[arg(long, default_value_t = 64)]
    mb: u64,
    /// Share of operations that are writes, in percent (0 = all reads).
    #[arg(long, default_value_t = 0)]
    write_pct: u32,
    /// Stop after this many operations (0 = no limit).
    #[arg(long, default_value_t = 0)]
    count: u64,
    /// Stop after this many seconds (0 = no limit; one of the two must be set).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Write the whole range sequentially with the pattern first.
    #[arg(long)]
    prefill: bool,
    /// Seed of the page pattern and of the offsets; a run without
    /// `--prefill` must use the seed the range was pre-filled with.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Threads issuing I/O at once, each on its own pages (the queue depth).
    #[arg(long, default_value_t = 1)]
    jobs: u32,
}

/// One page-aligned 4 KB buffer, as `O_DIRECT` requires.
struct AlignedPage {
    ptr: *mut u8,
}

impl AlignedPage {
    /// The layout of one page aligned to a page.
    fn layout() -> Result<Layout, String> {
        Layout::from_size_align(PAGE, PAGE).map_err(|e| e.to_string())
    }

    /// A zeroed page-aligned buffer.
    fn new() -> Result<AlignedPage, String> {
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(Self::layout()?) };
        if ptr.is_null() {
            return Err("out of memory for the I/O buffer".into());
        }
        Ok(AlignedPage { ptr })
    }

    /// The buffer's bytes.
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of PAGE bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, PAGE) }
    }
}

impl Drop for AlignedPage {
    fn drop(&mut self) {
        if let Ok(l) = Self::layout() {
            // SAFETY: allocated in new() with this same layout.
            unsafe { dealloc(self.ptr, l) };
        }
    }
}

/// splitmix64 step: the random offsets and the read/write choice.
fn next_rand(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The value at quantile `q` of sorted latencies (ns), in microseconds.
fn pct_us(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64) * q).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1] as f64 / 1000.0
}

/// Latency summary of one kind of operation.
fn lat_json(mut ns: Vec<u64>) -> Value {
    ns.sort_unstable();
    json!({
        "ops": ns.len(),
        "p50_us": r3(pct_us(&ns, 0.50)),
        "p99_us": r3(pct_us(&ns, 0.99)),
        "max_us": r3(pct_us(&ns, 1.0)),
    })
}

/// Opens the device for direct I/O.
fn open_direct(path: &PathBuf) -> Result<File, String> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| format!("open {} with O_DIRECT: {e}", path.display()))
}

/// Writes every page of the range with generation 0; returns MB/s.
fn prefill(f: &File, pages: u64, seed: u64, buf: &mut AlignedPage) -> Result<f64, String> {
    let t = Instant::now();
    for p in 0..pages {
        fill_page(buf.bytes(), seed, 0, p);
        f.write_all_at(buf.bytes(), p * PAGE as u64)
            .map_err(|e| format!("prefill write of page {p}: {e}"))?;
    }
    f.sync_all()
        .map_err(|e| format!("fsync after prefill: {e}"))?;
    let secs = t.elapsed().as_secs_f64().max(1e-9);
    Ok((pages * PAGE as u64) as f64 / 1_048_576.0 / secs)
}

/// What the random loop measured.
struct LoopResult {
    reads: Vec<u64>,
    writes: Vec<u64>,
    bad_pages: u64,
}

/// The pages one job owns: `job`, `job + jobs`, `job + 2 * jobs`, ... below
/// `pages`. Owning a disjoint set is what lets every job verify each of its
/// reads against the generation it wrote last, without sharing state.
struct Share {
    job: u64,
    jobs: u64,
    count: u64,
}

impl Share {
    /// The share of job `job` of `jobs` over `pages` pages (never empty
    /// while `jobs <= pages`).
    fn new(job: u64, jobs: u64, pages: u64) -> Share {
        Share {
            job,
            jobs,
            count: (pages - job).div_ceil(jobs),
        }
    }

    /// The device page of the share's `i`-th page.
    fn page(&self, i: u64) -> u64 {
        self.job + i * self.jobs
    }
}

/// The random 4 KB loop of one job: one synchronous operation at a time
/// over its own pages; `done` counts the operations of all jobs, for
/// `--count`.
fn random_loop(
    f: &File,
    args: &Args,
    share: &Share,
    done: &AtomicU64,
    start: Instant,
) -> Result<LoopResult, String> {
    let mut buf = AlignedPage::new()?;
    // Generation last written to each page of the share: a read must find exactly it.
    let mut gen = vec![0u32; share.count as usize];
    // Job 0 draws the same offsets as a run with one job always did.
    let mut rng = args.seed ^ 0x5241_4e44_494f ^ share.job.wrapping_mul(0x9e37_79b9); // "RANDIO"
    let limit = Duration::from_secs_f64(args.seconds.max(0.0));
    let (mut reads, mut writes, mut bad_pages) = (Vec::new(), Vec::new(), 0u64);
    let mut mine = 0u64;
    loop {
        if args.count > 0 && done.fetch_add(1, Ordering::Relaxed) >= args.count {
            break;
        }
        // Checking the clock every 64 ops keeps its cost out of the loop.
        if args.seconds > 0.0 && mine % 64 == 0 && start.elapsed() >= limit {
            break;
        }
        mine += 1;
        let i = next_rand(&mut rng) % share.count;
        let p = share.page(i);
        let off = p * PAGE as u64;
        let write = (next_rand(&mut rng) % 100) < u64::from(args.write_pct);
        let g = &mut gen[i as usize];
        if write {
            *g = g.wrapping_add(1);
            fill_page(buf.bytes(), args.seed, u64::from(*g), p);
            let t = Instant::now();
            f.write_all_at(buf.bytes(), off)
                .map_err(|e| format!("write of page {p}: {e}"))?;
            writes.push(t.elapsed().as_nanos() as u64);
        } else {
            let t = Instant::now();
            f.read_exact_at(buf.bytes(), off)
                .map_err(|e| format!("read of page {p}: {e}"))?;
            reads.push(t.elapsed().as_nanos() as u64);
            if !page_matches(buf.bytes(), args.seed, u64::from(*g), p) {
                bad_pages += 1;
            }
        }
    }
    Ok(LoopResult {
        reads,
        writes,
        bad_pages,
    })
}

/// Runs `--jobs` random loops at once (queue depth = jobs) and pools what
/// they measured; returns it with the wall time of the slowest.
fn run_jobs(f: &File, args: &Args, pages: u64) -> Result<(LoopResult, Duration), String> {
    let jobs = u64::from(args.jobs);
    let done = AtomicU64::new(0);
    let start = Instant::now();
    let results = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for job in 0..jobs {
            let (share, done) = (Share::new(job, jobs, pages), &done);
            let h = std::thread::Builder::new()
                .name(format!("randio-{job}"))
                .spawn_scoped(s, move || random_loop(f, args, &share, done, start))
                .map_err(|e| format!("cannot start job {job}: {e}"))?;
            handles.push(h);
        }
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| "a job panicked".to_string())?)
            .collect::<Result<Vec<_>, String>>()
    })?;
    let elapsed = start.elapsed();
    let mut all = LoopResult {
        reads: Vec::new(),
        writes: Vec::new(),
        bad_pages: 0,
    };
    for r in results {
        all.reads.extend(r.reads);
        all.writes.extend(r.writes);
        all.bad_pages += r.bad_pages;
    }
    Ok((all, elapsed))
}

/// Runs the whole program and builds its JSON result.
fn run(args: &Args) -> Result<Value, String> {
    if args.count == 0 && args.seconds <= 0.0 {
        return Err("set --count or --seconds: the loop needs a bound".into());
    }
    if args.write_pct > 100 {
        return Err("--write-pct is a percentage (0..=100)".into());
    }
    let pages = args.mb * 1_048_576 / PAGE as u64;
    if pages == 0 {
        return Err("--mb must be at least 1".into());
    }
    if args.jobs == 0 || u64::from(args.jobs) > pages {
        return Err("--jobs must be between 1 and the pages of the range".into());
    }
    let f = open_direct(&args.dev)?;
    let prefill_mb_s = if args.prefill {
        Some(r3(prefill(&f, pages, args.seed, &mut AlignedPage::new()?)?))
    } else {
        None
    };
    let (r, elapsed) = run_jobs(&f, args, pages)?;
    let ops = (r.reads.len() + r.writes.len()) as f64;
    let secs = elapsed.as_secs_f64().max(1e-9);
    let all: Vec<u64> = r.reads.iter().chain(r.writes.iter()).copied().collect();
    Ok(json!({
        "program": "randio",
        "dev": args.dev.display().to_string(),
        "range_mb": args.mb,
        "write_pct": args.write_pct,
        "queue_depth": args.jobs,
        "prefill_mb_s": prefill_mb_s,
        "seconds": r3(secs),
        "iops": r3(ops / secs),
        "mb_s": r3(ops * PAGE as f64 / 1_048_576.0 / secs),
        "all": lat_json(all),
        "read": lat_json(r.reads),
        "write": lat_json(r.writes),
        "bad_pages": r.bad_pages,
        "ok": r.bad_pages == 0,
    }))
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(v) => {
            let bad = v["bad_pages"].as_u64().unwrap_or(1);
            println!("{v}");
            if bad == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("randio: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_ranked_sample() {
        let v: Vec<u64> = (1..=100).map(|x| x * 1000).collect();
        assert_eq!(pct_us(&v, 0.50), 50.0);
        assert_eq!(pct_us(&v, 0.99), 99.0);
        assert_eq!(pct_us(&v, 1.0), 100.0);
        assert_eq!(pct_us(&[], 0.5), 0.0);
    }

    #[test]
    fn shares_cover_every_page_once() {
        for (jobs, pages) in [(1, 10), (4, 10), (4, 4), (3, 16384)] {
            let mut seen = vec![0u32; pages as usize];
            for job in 0..jobs {
                let sh = Share::new(job, jobs, pages);
                assert!(sh.count > 0);
                for i in 0..sh.count {
                    assert_eq!(sh.page(i) % jobs, job);
                    seen[sh.page(i) as usize] += 1;
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "jobs {jobs} pages {pages}");
        }
    }

    /// A mixed run of `jobs` jobs on a 1 MB file; None where the file
    /// system refuses O_DIRECT (tmpfs), as there is nothing to check then.
    fn mixed_run(jobs: u32) -> Option<Value> {
        let dir = std::env::temp_dir().join(format!("randio-test-{}-{jobs}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("dev");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let args = Args {
            dev: path.clone(),
            mb: 1,
            write_pct: 50,
            count: 2000,
            seconds: 0.0,
            prefill: true,
            seed: 3,
            jobs,
        };
        if open_direct(&path).is_err() {
            std::fs::remove_dir_all(&dir).unwrap();
            eprintln!("skipped: {} refuses O_DIRECT", dir.display());
            return None;
        }
        let v = run(&args);
        std::fs::remove_dir_all(&dir).unwrap();
        Some(v.unwrap())
    }

    #[test]
    fn mixed_runs_on_a_file_verify_every_read() {
        for jobs in [1, 4] {
            let Some(v) = mixed_run(jobs) else { return };
            assert_eq!(v["bad_pages"], 0);
            assert_eq!(v["queue_depth"], jobs);
            let reads = v["read"]["ops"].as_u64().unwrap();
            let writes = v["write"]["ops"].as_u64().unwrap();
            assert_eq!(reads + writes, 2000);
            assert!(reads > 500 && writes > 500, "{v}");
        }
    }

    #[test]
    fn more_jobs_than_pages_is_an_error() {
        let args = Args {
            dev: PathBuf::from("/nonexistent"),
            mb: 1,
            write_pct: 0,
            count: 1,
            seconds: 0.0,
            prefill: false,
            seed: 1,
            jobs: 257,
        };
        assert!(run(&args).unwrap_err().contains("--jobs"));
    }
}
