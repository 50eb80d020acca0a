//! munmap_bench: how long munmap(2) of swapped-out memory takes.
//!
//! A port of the seed's microbenchmark (the zsmalloc per-CPU deferred free
//! series): each of P processes maps N MB of anonymous memory, fills it with
//! a pattern that compresses about 2.8:1, pushes it out to swap with
//! `MADV_PAGEOUT`, and then, all together, unmaps it; the time of each
//! munmap is what freeing swap slots costs the exiting process.
//!
//! Between page-out and munmap each process reports `{"event":"paged_out"}`
//! on stdout; with `--wait-file PATH` the unmap waits until PATH exists, so
//! a test can read the swap device's statistics in between. The result is
//! one JSON object on stdout.
//!
//! `munmap_bench --mb 256 --procs 1 [--wait-file /tmp/go]`

mod workload;

use clap::Parser;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};
use workload::{fill_page, r3, status_kb, Mapping, PAGE};

/// `MADV_PAGEOUT` (Linux 5.4+), spelled out for libc versions without it.
const MADV_PAGEOUT: libc::c_int = 21;

/// Command line of munmap_bench.
#[derive(Parser, Debug, Clone)]
#[command(about = "time munmap of swapped-out memory")]
struct Args {
    /// MB each process maps, fills and swaps out.
    #[arg(long, default_value_t = 256)]
    mb: u64,
    /// Processes that unmap at the same time.
    #[arg(long, default_value_t = 1)]
    procs: u32,
    /// Page-out rounds at most, until `--min-swap-pct` of the region is in swap.
    #[arg(long, default_value_t = 5)]
    pageout_rounds: u32,
    /// Share of the region that must be in swap before unmapping.
    #[arg(long, default_value_t = 90)]
    min_swap_pct: u64,
    /// Wait until this file exists before unmapping.
    #[arg(long)]
    wait_file: Option<PathBuf>,
    /// Give up waiting for `--wait-file` after this many seconds.
    #[arg(long, default_value_t = 600)]
    wait_timeout: u64,
    /// Seed of the page pattern.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Internal: run as worker process N (reads one byte on stdin as "go").
    #[arg(long, hide = true)]
    worker: Option<u32>,
}

/// Maps, fills and pages out; prints the paged_out line; unmaps on "go".
fn run_worker(args: &Args, idx: u32) -> Result<Value, String> {
    let len = usize::try_from(args.mb * 1024 * 1024).map_err(|_| "size too large".to_string())?;
    let mut map = Mapping::new(len).map_err(|e| format!("mmap {} MB: {e}", args.mb))?;
    let t = Instant::now();
    for (i, page) in map.bytes().chunks_exact_mut(PAGE).enumerate() {
        fill_page(page, args.seed, u64::from(idx), i as u64);
    }
    let fill = t.elapsed();
    let t = Instant::now();
    let want_kb = args.mb * 1024 * args.min_swap_pct / 100;
    let mut rounds = 0;
    while rounds < args.pageout_rounds.max(1) {
        rounds += 1;
        map.advise(MADV_PAGEOUT)
            .map_err(|e| format!("madvise(MADV_PAGEOUT): {e}"))?;
        if status_kb("VmSwap") >= want_kb {
            break;
        }
    }
    let pageout = t.elapsed();
    let swap_kb = status_kb("VmSwap");
    let paged = json!({ "event": "paged_out", "proc": idx, "swap_kb": swap_kb,
        "rss_kb": status_kb("VmRSS"), "rounds": rounds });
    println!("{paged}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut go = [0u8; 1];
    // EOF counts as "go" too: the parent is gone and the result still matters.
    let _ = std::io::stdin().read(&mut go);
    let took = map.unmap().map_err(|e| format!("munmap: {e}"))?;
    Ok(json!({ "proc": idx, "fill_s": r3(fill.as_secs_f64()),
        "pageout_s": r3(pageout.as_secs_f64()), "swap_kb": swap_kb,
        "munmap_ms": r3(took.as_secs_f64() * 1000.0) }))
}

/// Waits until `path` exists (or the timeout passes).
fn wait_for(path: &Path, timeout: Duration) -> Result<(), String> {
    let t = Instant::now();
    while !path.exists() {
        if t.elapsed() > timeout {
            return Err(format!("{} did not appear in {timeout:?}", path.display()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Reads one JSON line from a worker.
fn read_json(r: &mut impl BufRead, what: &str) -> Result<Value, String> {
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| format!("{what}: {e}"))?;
    serde_json::from_str(&line).map_err(|_| format!("{what}: no result (worker failed)"))
}

/// Runs the workers, releases them together, and builds the report.
fn run(args: &Args) -> Result<Value, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut workers = Vec::new();
    for p in 0..args.procs {
        let mut child = Command::new(&exe)
            .args([
                "--mb",
                &args.mb.to_string(),
                "--seed",
                &args.seed.to_string(),
            ])
            .args(["--pageout-rounds", &args.pageout_rounds.to_string()])
            .args(["--min-swap-pct", &args.min_swap_pct.to_string()])
            .args(["--worker", &p.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn worker {p}: {e}"))?;
        let out = child.stdout.take().ok_or("no worker stdout")?;
        workers.push((child, BufReader::new(out)));
    }
    let mut swap_kb = 0;
    for (p, (_, out)) in workers.iter_mut().enumerate() {
        let v = read_json(out, &format!("worker {p} page-out"))?;
        swap_kb += v["swap_kb"].as_u64().unwrap_or(0);
    }
    let paged = json!({ "event": "paged_out", "procs": args.procs, "swap_kb": swap_kb });
    println!("{paged}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    if let Some(f) = &args.wait_file {
        wait_for(f, Duration::from_secs(args.wait_timeout))?;
    }
    for (child, _) in workers.iter_mut() {
        // Dropping stdin closes the pipe: the worker's read returns and it unmaps.
        drop(child.stdin.take());
    }
    let mut per = Vec::new();
    for (p, (mut child, mut out)) in workers.into_iter().enumerate() {
        per.push(read_json(&mut out, &format!("worker {p} munmap"))?);
        let _ = child.wait();
    }
    let ms: Vec<f64> = per.iter().filter_map(|v| v["munmap_ms"].as_f64()).collect();
    let max = ms.iter().copied().fold(0.0, f64::max);
    let mean = ms.iter().sum::<f64>() / ms.len().max(1) as f64;
    Ok(
        json!({ "program": "munmap_bench", "mb": args.mb, "procs": args.procs,
        "swap_kb": swap_kb, "swapped_pct": r3(swap_kb as f64 * 100.0 / (args.mb * 1024 * u64::from(args.procs)) as f64),
        "munmap_ms_max": r3(max), "munmap_ms_mean": r3(mean), "workers": per }),
    )
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.mb == 0 || args.procs == 0 {
        eprintln!("munmap_bench: --mb and --procs must be at least 1");
        return ExitCode::from(2);
    }
    let res = match args.worker {
        Some(idx) => run_worker(&args, idx),
        None => run(&args),
    };
    match res {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("munmap_bench: {e}");
            ExitCode::from(2)
        }
    }
}
