//! usemem: memory pressure that proves every page survives.
//!
//! N worker processes (and T threads in each) each map M MB of anonymous
//! memory, write every page with a pattern unique to (seed, worker, page)
//! that compresses about 2.8:1, hold it for a while (so that a memory cgroup
//! limit or `memory.reclaim` pushes it out to swap), then read every page
//! back and compare it with the pattern (`--hold-file` holds until a
//! file appears instead). It prints one JSON object with the
//! throughput of both phases and the number of bad pages, and exits 1 when
//! any page differs, 2 on any other failure.
//!
//! With `--corpus FILE` the pages come from a file of real memory pages
//! (raw, or zstd-compressed if it ends in `.zst`: `shared/corpus/`) instead:
//! page `i` of stream `s` is the file's page `(i + s * 7919 + seed) % n`, so
//! that the compression ratio is real memory's and each stream holds the
//! pages in another order (a page handed back for another stream's differs).
//!
//! With `--scatter` the verify passes read the pages in a scattered order
//! (page `i * k mod n` for a large `k` coprime with `n`) instead of in
//! address order: swap-ins at random, where readahead mostly fetches pages
//! nobody asked for.
//!
//! With `--fork` each thread forks once its pages are written: the child
//! holds the same pages (copy-on-write, never written), sleeps and
//! verifies them as the parent does, so that every page is mapped by two
//! processes, and a bad page in either fails the run.
//!
//! `usemem --mb 128 --procs 2 --sleep 2 --passes 1`
//! `usemem --mb 128 --corpus /lib/zblk-vm/data/realmem-dev.bin.zst`

mod workload;

use clap::Parser;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use workload::{fill_page, page_matches, r3, Mapping, PAGE};

/// Command line of usemem.
#[derive(Parser, Debug, Clone)]
#[command(about = "allocate, write, hold and verify memory (swap pressure test)")]
struct Args {
    /// MB each worker thread allocates and writes.
    #[arg(long, default_value_t = 64)]
    mb: u64,
    /// Worker processes.
    #[arg(long, default_value_t = 1)]
    procs: u32,
    /// Threads in each worker process.
    #[arg(long, default_value_t = 1)]
    threads: u32,
    /// Seconds to hold the memory between writing and verifying.
    #[arg(long, default_value_t = 0.0)]
    sleep: f64,
    /// Verification passes over all pages.
    #[arg(long, default_value_t = 1)]
    passes: u32,
    /// Seed of the page pattern.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Fill pages from this file of real memory pages (raw, or zstd if it
    /// ends in .zst) instead of the synthetic pattern.
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Append a line to this file as each thread ends a phase ("written",
    /// then "verified"): what a measuring script splits swap-out from
    /// swap-in by.
    #[arg(long)]
    mark: Option<PathBuf>,
    /// Verify the pages in a scattered order, not in address order.
    #[arg(long)]
    scatter: bool,
    /// madvise(MADV_HUGEPAGE) each mapping before writing it, so that the
    /// sizes set to `madvise` in /sys/kernel/mm/transparent_hugepage
    /// (`enabled` for 2 MB, `hugepages-<N>kB/enabled` for mTHP) fault in
    /// as large folios, and are swapped out as such.
    #[arg(long)]
    thp: bool,
    /// Fork after writing: the child holds the same pages (shared
    /// copy-on-write, never written) and verifies them too, so that every
    /// swapped page is mapped by two processes.
    #[arg(long)]
    fork: bool,
    /// After writing (and `--sleep`), hold until this file exists: what a
    /// scenario ends the hold with once it has done its work on the held
    /// pages, however long that took.
    #[arg(long)]
    hold_file: Option<PathBuf>,
    /// Internal: run as worker process number N and print its JSON line.
    #[arg(long, hide = true)]
    worker: Option<u32>,
}

/// What one worker thread measured.
#[derive(Default, Clone, Copy)]
struct ThreadResult {
    pages: u64,
    write: Duration,
    verify: Duration,
    bad_pages: u64,
    /// First bad page (page index) if any.
    first_bad: Option<u64>,
}

/// What the pages hold.
#[derive(Clone)]
enum Pattern {
    /// The synthetic pattern of this seed (about 2.8:1 with lz4).
    Synthetic(u64),
    /// Pages of a corpus file, in an order set by the seed and the stream.
    Corpus { pages: Arc<Vec<u8>>, seed: u64 },
}

impl Pattern {
    /// The pattern `args` asks for (the corpus file read and checked).
    fn of(args: &Args) -> Result<Pattern, String> {
        let Some(path) = &args.corpus else {
            return Ok(Pattern::Synthetic(args.seed));
        };
        let shown = path.display();
        let raw = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let mut pages = if path.extension().is_some_and(|e| e == "zst") {
            zstd::stream::decode_all(&raw[..])
                .map_err(|e| format!("cannot decompress {shown} as zstd: {e}"))?
        } else {
            raw
        };
        pages.truncate(pages.len() / PAGE * PAGE);
        if pages.is_empty() {
            return Err(format!("{shown} holds no whole 4 KB page"));
        }
        Ok(Pattern::Corpus {
            pages: Arc::new(pages),
            seed: args.seed,
        })
    }

    /// The corpus page that page `index` of `stream` holds.
    fn corpus_page(pages: &[u8], seed: u64, stream: u64, index: u64) -> &[u8] {
        let n = (pages.len() / PAGE) as u64;
        let k = (index
            .wrapping_add(stream.wrapping_mul(7919))
            .wrapping_add(seed)
            % n) as usize;
        &pages[k * PAGE..(k + 1) * PAGE]
    }

    fn fill(&self, page: &mut [u8], stream: u64, index: u64) {
        match self {
            Pattern::Synthetic(seed) => fill_page(page, *seed, stream, index),
            Pattern::Corpus { pages, seed } => {
                page.copy_from_slice(Self::corpus_page(pages, *seed, stream, index));
            }
        }
    }

    fn matches(&self, page: &[u8], stream: u64, index: u64) -> bool {
        match self {
            Pattern::Synthetic(seed) => page_matches(page, *seed, stream, index),
            Pattern::Corpus { pages, seed } => {
                page == Self::corpus_page(pages, *seed, stream, index)
            }
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Pattern::Synthetic(_) => "synthetic",
            Pattern::Corpus { .. } => "corpus",
        }
    }
}

/// Writes, holds and verifies the memory of worker stream `stream`.
fn run_thread(args: &Args, pat: &Pattern, stream: u64) -> std::io::Result<ThreadResult> {
    let len = usize::try_from(args.mb * 1024 * 1024)
        .map_err(|_| std::io::Error::other("size does not fit in memory"))?;
    let mut map = Mapping::new(len)?;
    if args.thp {
        map.advise(libc::MADV_HUGEPAGE)?;
    }
    let mut res = ThreadResult {
        pages: (len / PAGE) as u64,
        ..Default::default()
    };
    let t = Instant::now();
    for (i, page) in map.bytes().chunks_exact_mut(PAGE).enumerate() {
        pat.fill(page, stream, i as u64);
    }
    res.write = t.elapsed();
    mark(args, "written")?;
    let child = if args.fork {
        Some(fork_verifier(args, map.bytes(), pat, stream)?)
    } else {
        None
    };
    hold(args);
    let t = Instant::now();
    for _ in 0..args.passes {
        let (bad, first) = verify(map.bytes(), pat, stream, args.scatter);
        res.bad_pages += bad;
        res.first_bad = res.first_bad.or(first);
    }
    res.verify = t.elapsed();
    if let Some(pid) = child {
        wait_verifier(pid)?;
    }
    mark(args, "verified")?;
    Ok(res)
}

/// Holds the written pages: `--sleep` seconds, then until the
/// `--hold-file` exists.
fn hold(args: &Args) {
    std::thread::sleep(Duration::from_secs_f64(args.sleep.max(0.0)));
    if let Some(path) = &args.hold_file {
        while !path.exists() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Forks a child that holds `mem` as it is (the same pages, shared
/// copy-on-write), holds as long as the parent and verifies every page;
/// its exit status says whether all matched. Returns its pid.
fn fork_verifier(args: &Args, mem: &[u8], pat: &Pattern, stream: u64) -> std::io::Result<i32> {
    // SAFETY: fork(2) has no memory preconditions. The child runs only
    // code that takes no lock and allocates nothing (sleep, stat(2) of
    // the hold file through std's on-stack path buffer, the page
    // comparison, _exit), so the other threads' state it inherits does
    // not matter.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid > 0 {
        return Ok(pid);
    }
    hold(args);
    let mut bad = 0;
    for _ in 0..args.passes {
        bad += verify(mem, pat, stream, args.scatter).0;
    }
    // SAFETY: _exit(2) ends the child without running the parent's exit
    // handlers or flushing its buffers.
    unsafe { libc::_exit(i32::from(bad > 0)) }
}

/// Waits for the child of [`fork_verifier`]: an error unless it found
/// every page intact.
fn wait_verifier(pid: i32) -> std::io::Result<()> {
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer for the call's duration.
    if unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        return Ok(());
    }
    Err(std::io::Error::other(format!(
        "the forked copy (pid {pid}) found bad pages or died (wait status {status})"
    )))
}

/// Appends `what` as a line to the `--mark` file, if there is one.
fn mark(args: &Args, what: &str) -> std::io::Result<()> {
    let Some(path) = &args.mark else {
        return Ok(());
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    // One write(2), so that lines of several threads never interleave.
    f.write_all(format!("{what}\n").as_bytes())
}

/// Compares every page of `mem` with its pattern, in address order or
/// (`scatter`) in a scattered one; returns the number of bad pages and the
/// index of the first one in the order read.
fn verify(mem: &[u8], pat: &Pattern, stream: u64, scatter: bool) -> (u64, Option<u64>) {
    let n = (mem.len() / PAGE) as u64;
    let step = if scatter { scatter_step(n) } else { 1 };
    let mut bad = 0;
    let mut first = None;
    for j in 0..n {
        let i = ((u128::from(j) * u128::from(step)) % u128::from(n.max(1))) as u64;
        let at = i as usize * PAGE;
        if !pat.matches(&mem[at..at + PAGE], stream, i) {
            bad += 1;
            first.get_or_insert(i);
        }
    }
    (bad, first)
}

/// A step coprime with `n` (so `j * step mod n` visits every page once)
/// and far from any small multiple of a page cluster: about `n` times the
/// golden ratio's fraction, made odd and moved until coprime.
fn scatter_step(n: u64) -> u64 {
    if n < 3 {
        return 1;
    }
    let mut k = ((n as f64 * 0.618_033_988_75) as u64) | 1;
    while gcd(k, n) != 1 {
        k += 2;
    }
    k
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Runs the threads of worker process `proc_idx`; returns its JSON summary.
fn run_worker(args: &Args, pat: &Pattern, proc_idx: u32) -> Value {
    let threads: Vec<_> = (0..args.threads)
        .map(|t| {
            let (a, p) = (args.clone(), pat.clone());
            let stream = u64::from(proc_idx) * u64::from(args.threads) + u64::from(t);
            std::thread::spawn(move || run_thread(&a, &p, stream))
        })
        .collect();
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (t, h) in threads.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(r)) => out.push(json!({
                "thread": t, "pages": r.pages, "write_s": r.write.as_secs_f64(),
                "verify_s": r.verify.as_secs_f64(), "bad_pages": r.bad_pages,
                "first_bad": r.first_bad,
            })),
            Ok(Err(e)) => errors.push(format!("thread {t}: {e}")),
            Err(_) => errors.push(format!("thread {t} panicked")),
        }
    }
    json!({ "proc": proc_idx, "threads": out, "errors": errors })
}

/// Starts the worker processes and collects their JSON lines.
fn run_procs(args: &Args) -> Result<Vec<Value>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut children = Vec::new();
    for p in 0..args.procs {
        let child = Command::new(&exe)
            .args([
                "--mb",
                &args.mb.to_string(),
                "--threads",
                &args.threads.to_string(),
            ])
            .args([
                "--sleep",
                &args.sleep.to_string(),
                "--passes",
                &args.passes.to_string(),
            ])
            .args(["--seed", &args.seed.to_string(), "--worker", &p.to_string()])
            .args(
                args.corpus
                    .iter()
                    .flat_map(|c| [std::ffi::OsStr::new("--corpus"), c.as_os_str()]),
            )
            .args(
                args.mark
                    .iter()
                    .flat_map(|m| [std::ffi::OsStr::new("--mark"), m.as_os_str()]),
            )
            .args(
                args.hold_file
                    .iter()
                    .flat_map(|m| [std::ffi::OsStr::new("--hold-file"), m.as_os_str()]),
            )
            .args(args.scatter.then_some("--scatter"))
            .args(args.thp.then_some("--thp"))
            .args(args.fork.then_some("--fork"))
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn worker {p}: {e}"))?;
        children.push(child);
    }
    let mut results = Vec::new();
    for (p, mut child) in children.into_iter().enumerate() {
        let line = child
            .stdout
            .take()
            .and_then(|o| BufReader::new(o).lines().next())
            .and_then(|l| l.ok())
            .unwrap_or_default();
        let status = child.wait().map_err(|e| format!("wait worker {p}: {e}"))?;
        match serde_json::from_str::<Value>(&line) {
            Ok(v) => results.push(v),
            Err(_) => results.push(json!({ "proc": p, "threads": [],
                "errors": [format!("worker {p} died without a result ({status})")] })),
        }
    }
    Ok(results)
}

/// Sums the per-thread results into the report.
fn report(args: &Args, pat: &Pattern, procs: &[Value], wall: Duration) -> (Value, bool) {
    let (mut pages, mut bad, mut write_s, mut verify_s) = (0u64, 0u64, 0f64, 0f64);
    let mut first_bad = Value::Null;
    let mut errors: Vec<Value> = Vec::new();
    for p in procs {
        errors.extend(p["errors"].as_array().cloned().unwrap_or_default());
        for t in p["threads"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            pages += t["pages"].as_u64().unwrap_or(0);
            let b = t["bad_pages"].as_u64().unwrap_or(0);
            if b > 0 && first_bad.is_null() {
                first_bad =
                    json!({ "proc": p["proc"], "thread": t["thread"], "page": t["first_bad"] });
            }
            bad += b;
            write_s = write_s.max(t["write_s"].as_f64().unwrap_or(0.0));
            verify_s = verify_s.max(t["verify_s"].as_f64().unwrap_or(0.0));
        }
    }
    let workers = u64::from(args.procs) * u64::from(args.threads);
    let total_mb = (workers * args.mb) as f64;
    let expect_pages = workers * args.mb * 1024 * 1024 / PAGE as u64;
    let ok = bad == 0 && errors.is_empty() && pages == expect_pages;
    let per_s = |s: f64| if s > 0.0 { r3(total_mb / s) } else { 0.0 };
    let v = json!({
        "program": "usemem", "ok": ok, "pattern": pat.name(), "procs": args.procs, "threads": args.threads,
        "mb_per_worker": args.mb, "total_mb": total_mb, "pages": pages,
        "write_s": r3(write_s), "write_mb_s": per_s(write_s),
        "verify_s": r3(verify_s), "verify_mb_s": per_s(verify_s * f64::from(args.passes.max(1)).recip()),
        "passes": args.passes, "thp": args.thp, "bad_pages": bad, "first_bad": first_bad,
        "errors": errors, "wall_s": r3(wall.as_secs_f64()),
    });
    (v, ok)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let pat = match Pattern::of(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("usemem: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(p) = args.worker {
        let v = run_worker(&args, &pat, p);
        println!("{v}");
        let _ = std::io::stdout().flush();
        return ExitCode::SUCCESS;
    }
    if args.procs == 0 || args.threads == 0 || args.mb == 0 {
        eprintln!("usemem: --procs, --threads and --mb must be at least 1");
        return ExitCode::from(2);
    }
    let t = Instant::now();
    let procs = match args.procs {
        1 => vec![run_worker(&args, &pat, 0)],
        _ => match run_procs(&args) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("usemem: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let (v, ok) = report(&args, &pat, &procs, t.elapsed());
    println!("{v}");
    if ok {
        ExitCode::SUCCESS
    } else if v["bad_pages"].as_u64().unwrap_or(0) > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::from(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_finds_every_changed_page() {
        let mut mem = vec![0u8; 16 * PAGE];
        for (i, page) in mem.chunks_exact_mut(PAGE).enumerate() {
            fill_page(page, 9, 2, i as u64);
        }
        let p9 = Pattern::Synthetic(9);
        assert_eq!(verify(&mem, &p9, 2, false), (0, None));
        mem[5 * PAGE + 100] ^= 0x40;
        mem[11 * PAGE] ^= 1;
        assert_eq!(verify(&mem, &p9, 2, false), (2, Some(5)));
        // Another worker's pages or another run's never verify.
        assert_eq!(verify(&mem, &p9, 3, false).0, 16);
        assert_eq!(verify(&mem, &Pattern::Synthetic(8), 2, false).0, 16);
        // Scattered: the same pages found bad, the first one met first.
        let (bad, first) = verify(&mem, &p9, 2, true);
        assert_eq!(bad, 2);
        assert!(matches!(first, Some(5 | 11)));
    }

    #[test]
    fn scatter_visits_every_page_once_out_of_order() {
        for n in [3u64, 16, 1000, 98_304, 98_305] {
            let k = scatter_step(n);
            let mut seen = vec![false; n as usize];
            for j in 0..n {
                seen[((j * k) % n) as usize] = true;
            }
            assert!(seen.iter().all(|&s| s), "n {n} step {k}");
            assert!((k > 1 || n < 16) && k < n + 64, "n {n} step {k}");
        }
    }

    #[test]
    fn corpus_pages_verify_and_differ_by_stream() {
        // Eight distinct "real" pages.
        let corpus: Vec<u8> = (0..8u8)
            .flat_map(|k| vec![k.wrapping_mul(37) | 1; PAGE])
            .collect();
        let pat = Pattern::Corpus {
            pages: Arc::new(corpus),
            seed: 1,
        };
        let mut mem = vec![0u8; 16 * PAGE];
        for (i, page) in mem.chunks_exact_mut(PAGE).enumerate() {
            pat.fill(page, 2, i as u64);
        }
        assert_eq!(verify(&mem, &pat, 2, false), (0, None));
        // Stream 3 holds the same pages in another order: none matches.
        assert_eq!(verify(&mem, &pat, 3, false).0, 16);
        mem[7 * PAGE] ^= 0x80;
        assert_eq!(verify(&mem, &pat, 2, false), (1, Some(7)));
    }
}
