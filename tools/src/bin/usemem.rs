//! usemem: memory pressure that proves every page survives.
//!
//! N worker processes (and T threads in each) each map M MB of anonymous
//! memory, write every page with a pattern unique to (seed, worker, page)
//! that compresses about 2.8:1, hold it for a while (so that a memory cgroup
//! limit or `memory.reclaim` pushes it out to swap), then read every page
//! back and compare it with the pattern. It prints one JSON object with the
//! throughput of both phases and the number of bad pages, and exits 1 when
//! any page differs, 2 on any other failure.
//!
//! `usemem --mb 128 --procs 2 --sleep 2 --passes 1`

mod workload;

use clap::Parser;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitCode, Stdio};
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

/// Writes, holds and verifies the memory of worker stream `stream`.
fn run_thread(args: &Args, stream: u64) -> std::io::Result<ThreadResult> {
    let len = usize::try_from(args.mb * 1024 * 1024)
        .map_err(|_| std::io::Error::other("size does not fit in memory"))?;
    let mut map = Mapping::new(len)?;
    let mut res = ThreadResult {
        pages: (len / PAGE) as u64,
        ..Default::default()
    };
    let t = Instant::now();
    for (i, page) in map.bytes().chunks_exact_mut(PAGE).enumerate() {
        fill_page(page, args.seed, stream, i as u64);
    }
    res.write = t.elapsed();
    std::thread::sleep(Duration::from_secs_f64(args.sleep.max(0.0)));
    let t = Instant::now();
    for _ in 0..args.passes {
        let (bad, first) = verify(map.bytes(), args.seed, stream);
        res.bad_pages += bad;
        res.first_bad = res.first_bad.or(first);
    }
    res.verify = t.elapsed();
    Ok(res)
}

/// Compares every page of `mem` with its pattern; returns the number of bad
/// pages and the index of the first one.
fn verify(mem: &[u8], seed: u64, stream: u64) -> (u64, Option<u64>) {
    let mut bad = 0;
    let mut first = None;
    for (i, page) in mem.chunks_exact(PAGE).enumerate() {
        if !page_matches(page, seed, stream, i as u64) {
            bad += 1;
            first.get_or_insert(i as u64);
        }
    }
    (bad, first)
}

/// Runs the threads of worker process `proc_idx`; returns its JSON summary.
fn run_worker(args: &Args, proc_idx: u32) -> Value {
    let threads: Vec<_> = (0..args.threads)
        .map(|t| {
            let a = args.clone();
            let stream = u64::from(proc_idx) * u64::from(args.threads) + u64::from(t);
            std::thread::spawn(move || run_thread(&a, stream))
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
fn report(args: &Args, procs: &[Value], wall: Duration) -> (Value, bool) {
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
        "program": "usemem", "ok": ok, "procs": args.procs, "threads": args.threads,
        "mb_per_worker": args.mb, "total_mb": total_mb, "pages": pages,
        "write_s": r3(write_s), "write_mb_s": per_s(write_s),
        "verify_s": r3(verify_s), "verify_mb_s": per_s(verify_s * f64::from(args.passes.max(1)).recip()),
        "passes": args.passes, "bad_pages": bad, "first_bad": first_bad,
        "errors": errors, "wall_s": r3(wall.as_secs_f64()),
    });
    (v, ok)
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(p) = args.worker {
        let v = run_worker(&args, p);
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
        1 => vec![run_worker(&args, 0)],
        _ => match run_procs(&args) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("usemem: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let (v, ok) = report(&args, &procs, t.elapsed());
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
        assert_eq!(verify(&mem, 9, 2), (0, None));
        mem[5 * PAGE + 100] ^= 0x40;
        mem[11 * PAGE] ^= 1;
        assert_eq!(verify(&mem, 9, 2), (2, Some(5)));
        // Another worker's pages or another run's never verify.
        assert_eq!(verify(&mem, 9, 3).0, 16);
        assert_eq!(verify(&mem, 8, 2).0, 16);
    }
}
