//! Engine-level figures for BENCHMARKS.md, every ratio measured in this one
//! process with its baseline interleaved round by round, so machine noise
//! hits both alike. Usage:
//!
//!     engine_ratios FILE [--rounds N] [--scaling-only | --shared-cost | --reserve-cost | --mlock-cost] [ALGO...]
//!
//! Prints markdown tables: the store path against the bare codec (per
//! algorithm, group size and mode), random single-page read latency (the
//! price of packing), and thread scaling (1 vs 2 threads).

use std::path::PathBuf;
use std::time::Instant;
use zblk::{Algo, Mode, QueueCtx, Store, PAGE_SIZE};
use zblk_bench::engine::{codec_ceiling, load_input, run, BenchOptions, BenchReport};
use zblk_bench::{max, median, min};

/// Percentile of a sorted sample.
fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn bench(opts: &BenchOptions, data: &[u8]) -> Result<BenchReport, String> {
    let rep = run(opts, data).map_err(|e| e.to_string())?;
    if rep.verify_errors != 0 {
        return Err(format!("{} pages did not verify", rep.verify_errors));
    }
    Ok(rep)
}

/// A context on a new store of `data`'s size, as `opts` says.
fn new_store(opts: &BenchOptions, data: &[u8]) -> Result<QueueCtx, String> {
    let store = Store::new(opts.store_config(data.len() as u64)).map_err(|e| e.to_string())?;
    Ok(store.new_ctx())
}

/// Writes `data` from offset 0 in 16-page requests.
fn write_all(ctx: &mut QueueCtx, data: &[u8]) -> Result<(), String> {
    for (i, req) in data.chunks(16 * PAGE_SIZE).enumerate() {
        ctx.write((i * 16 * PAGE_SIZE) as u64, req)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Random single-page reads of a full store: per-read latency in µs
/// (p50, p99), as a swap-in of one page sees it.
fn random_reads(algo: Algo, g: usize, mode: Mode, data: &[u8]) -> Result<(f64, f64), String> {
    let opts = BenchOptions {
        algo,
        group_pages: g,
        mode,
        ..BenchOptions::default()
    };
    let mut ctx = new_store(&opts, data)?;
    write_all(&mut ctx, data)?;
    let pages = (data.len() / PAGE_SIZE) as u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = vec![0u8; PAGE_SIZE];
    let mut lat = Vec::with_capacity(20_000);
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let p = x % pages;
        let t0 = Instant::now();
        ctx.read(p * PAGE_SIZE as u64, &mut buf)
            .map_err(|e| e.to_string())?;
        lat.push(t0.elapsed().as_nanos() as f64 / 1000.0);
        let want = &data[(p as usize) * PAGE_SIZE..][..PAGE_SIZE];
        if buf != want {
            return Err(format!("page {p} did not verify"));
        }
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    Ok((pct(&lat, 0.5), pct(&lat, 0.99)))
}

/// What the OS charges for one fresh page of memory on this machine, in µs:
/// a new anonymous mapping backed two pages per `MADV_POPULATE_WRITE`, as
/// the slab backs a new zspage. The bare codec writes into memory it
/// already has; a fresh store must get every page it fills from the OS.
fn fresh_page_us() -> Result<f64, String> {
    let len = 64 << 20;
    // SAFETY: a fresh private anonymous mapping, unmapped before returning.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return Err("mmap failed".into());
        }
        let step = 2 * PAGE_SIZE;
        let t0 = Instant::now();
        for off in (0..len).step_by(step) {
            libc::madvise(
                p.cast::<u8>().add(off).cast(),
                step,
                libc::MADV_POPULATE_WRITE,
            );
        }
        let us = t0.elapsed().as_secs_f64() * 1e6 / (len / PAGE_SIZE) as f64;
        libc::munmap(p, len);
        Ok(us)
    }
}

/// The write / codec ratio with the store's fresh pages taken out: the
/// slab's pages (mem_used_total / 4 KB) times what the OS charges for one.
fn without_fresh_pages(rep: &BenchReport, ceil_mb_s: f64, page_us: f64, bytes: usize) -> f64 {
    let mb = bytes as f64 / 1e6;
    let write_s = mb / rep.write_mb_s;
    let pages = bytes as f64 / rep.ratio_mem / PAGE_SIZE as f64;
    let rest_s = (write_s - pages * page_us / 1e6).max(1e-9);
    mb / rest_s / ceil_mb_s
}

/// The physical limit: MB/s of copying the pages one by one into memory
/// written before the clock starts (what a store that did not compress at
/// all could at best do), median of `rounds`.
fn memcpy_mb_s(data: &[u8], rounds: usize) -> f64 {
    let mut dst = vec![1u8; data.len()];
    let mut v = Vec::with_capacity(rounds);
    for _ in 0..rounds.max(1) {
        let t0 = Instant::now();
        for (d, s) in dst
            .chunks_exact_mut(PAGE_SIZE)
            .zip(data.chunks_exact(PAGE_SIZE))
        {
            d.copy_from_slice(std::hint::black_box(s));
        }
        std::hint::black_box(&dst);
        v.push(data.len() as f64 / 1e6 / t0.elapsed().as_secs_f64());
    }
    median(v)
}

/// Steady-state writes: MB/s of overwriting every page of a full store
/// with other content (the corpus rotated by 7 requests), twice, as a device
/// that has been running sees writes: old objects die while new ones are
/// born, so the slab reuses memory instead of asking the OS for fresh pages.
/// The store as `opts` says.
fn overwrite_mb_s(opts: &BenchOptions, data: &[u8]) -> Result<f64, String> {
    let mut ctx = new_store(opts, data)?;
    let split = (7 * 16 * PAGE_SIZE).min(data.len());
    let rotated = [&data[split..], &data[..split]].concat();
    let mut secs = 0.0;
    for (pass, d) in [data, &rotated, data].into_iter().enumerate() {
        let t0 = Instant::now();
        write_all(&mut ctx, d)?;
        if pass > 0 {
            secs += t0.elapsed().as_secs_f64();
        }
    }
    Ok(2.0 * data.len() as f64 / 1e6 / secs)
}

fn store_vs_codec(algos: &[Algo], rounds: usize, data: &[u8]) -> Result<(), String> {
    println!("| algo | group | mode | ratio_mem | write MB/s | codec compress MB/s | write / codec | same, fresh pages excluded (est.) | overwrite / codec | read MB/s | codec decompress MB/s | read / codec | write p99 µs | rand read p50 µs | rand read p99 µs |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut page_us = vec![];
    for &algo in algos {
        for (g, mode) in [(1, Mode::PerPage), (8, Mode::PerPage), (8, Mode::Packed)] {
            let opts = BenchOptions {
                algo,
                group_pages: g,
                mode,
                ..BenchOptions::default()
            };
            let (mut w, mut r, mut c, mut d, mut wr, mut rr) =
                (vec![], vec![], vec![], vec![], vec![], vec![]);
            let (mut wx, mut ow) = (vec![], vec![]);
            let mut last = None;
            for _ in 0..rounds {
                let ceil = codec_ceiling(algo, data).map_err(|e| e.to_string())?;
                let rep = bench(&opts, data)?;
                let us = fresh_page_us()?;
                page_us.push(us);
                wx.push(without_fresh_pages(
                    &rep,
                    ceil.compress_mb_s,
                    us,
                    data.len(),
                ));
                wr.push(rep.write_mb_s / ceil.compress_mb_s);
                ow.push(overwrite_mb_s(&opts, data)? / ceil.compress_mb_s);
                rr.push(rep.read_mb_s / ceil.decompress_mb_s);
                c.push(ceil.compress_mb_s);
                d.push(ceil.decompress_mb_s);
                w.push(rep.write_mb_s);
                r.push(rep.read_mb_s);
                last = Some(rep);
            }
            let rep = last.ok_or("no rounds")?;
            let (p50, p99) = random_reads(algo, g, mode, data)?;
            println!(
                "| {algo} | {g} | {mode} | {:.2} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} | {:.2} | {:.1} | {p50:.1} | {p99:.1} |",
                rep.ratio_mem, median(w), median(c), median(wr), median(wx), median(ow), median(r), median(d), median(rr), rep.write_p99_us
            );
        }
    }
    println!();
    println!(
        "memcpy of the same pages, page by page (the physical limit): {:.0} MB/s.",
        memcpy_mb_s(data, rounds)
    );
    println!(
        "A fresh page from the OS (mmap + MADV_POPULATE_WRITE, 2 pages a call): {:.2} µs median over {} samples.",
        median(page_us.clone()),
        page_us.len()
    );
    Ok(())
}

/// The bare codec on two threads at once, each over every other 16-page
/// request (as the bench deals requests out): the machine's own scaling
/// limit (shared caches, memory bandwidth, the hypervisor). Returns the
/// (compress, decompress) scaling against one thread over all the pages.
fn codec_scaling(algo: Algo, data: &[u8]) -> Result<(f64, f64), String> {
    let req = 16 * PAGE_SIZE;
    let mut halves = [Vec::new(), Vec::new()];
    for (i, chunk) in data.chunks(req).enumerate() {
        halves[i % 2].extend_from_slice(chunk);
    }
    let one = codec_ceiling(algo, data).map_err(|e| e.to_string())?;
    let two: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = halves
            .iter()
            .map(|h| s.spawn(move || codec_ceiling(algo, h)))
            .collect();
        hs.into_iter().map(|h| h.join()).collect()
    });
    let mb = data.len() as f64 / 1e6;
    let (mut c2, mut d2) = (0.0f64, 0.0f64);
    for (r, h) in two.into_iter().zip(&halves) {
        let c = r
            .map_err(|_| "codec thread panicked")?
            .map_err(|e| e.to_string())?;
        let hmb = h.len() as f64 / 1e6;
        c2 = c2.max(hmb / c.compress_mb_s);
        d2 = d2.max(hmb / c.decompress_mb_s);
    }
    Ok((mb / c2 / one.compress_mb_s, mb / d2 / one.decompress_mb_s))
}

fn scaling(algos: &[Algo], rounds: usize, data: &[u8]) -> Result<(), String> {
    println!();
    println!("| algo | write MB/s 1 thread | 2 threads | write scaling | codec compress scaling | read MB/s 1 thread | 2 threads | read scaling | codec decompress scaling |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for &algo in algos {
        let (mut w1, mut w2, mut r1, mut r2, mut ws, mut rs) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        let (mut cs, mut ds) = (vec![], vec![]);
        for _ in 0..rounds {
            let (c, d) = codec_scaling(algo, data)?;
            cs.push(c);
            ds.push(d);
            let on = |threads| {
                let opts = BenchOptions {
                    algo,
                    threads,
                    ..BenchOptions::default()
                };
                bench(&opts, data)
            };
            let (one, two) = (on(1)?, on(2)?);
            ws.push(two.write_mb_s / one.write_mb_s);
            rs.push(two.read_mb_s / one.read_mb_s);
            w1.push(one.write_mb_s);
            w2.push(two.write_mb_s);
            r1.push(one.read_mb_s);
            r2.push(two.read_mb_s);
        }
        println!(
            "| {algo} | {:.0} | {:.0} | {:.2}x ({:.2}-{:.2}) | {:.2}x | {:.0} | {:.0} | {:.2}x ({:.2}-{:.2}) | {:.2}x |",
            median(w1),
            median(w2),
            median(ws.clone()),
            min(&ws),
            max(&ws),
            median(cs),
            median(r1),
            median(r2),
            median(rs.clone()),
            min(&rs),
            max(&rs),
            median(ds)
        );
    }
    Ok(())
}

/// The price of a recoverable store: shared memory (memfd, 16-byte slot
/// stores) against private memory, interleaved round by round.
/// One store setting against another, `a` (the baseline) and `b` as
/// `variant` sets them on the options, interleaved round by round: write
/// (a store growing), overwrite (steady state) and read MB/s, and b/a.
fn ab_cost(
    algos: &[Algo],
    rounds: usize,
    data: &[u8],
    names: [&str; 2],
    variant: fn(&mut BenchOptions, bool),
) -> Result<(), String> {
    let [a, b] = names;
    println!("| algo | mode | write MB/s {a} | {b} | write {b}/{a} | overwrite {b}/{a} | read MB/s {a} | {b} | read {b}/{a} |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for &algo in algos {
        for mode in [Mode::PerPage, Mode::Packed] {
            let mut w = [Vec::new(), Vec::new()];
            let mut o = [Vec::new(), Vec::new()];
            let mut r = [Vec::new(), Vec::new()];
            for _ in 0..rounds {
                for (i, on) in [false, true].into_iter().enumerate() {
                    let mut opts = BenchOptions {
                        algo,
                        mode,
                        ..BenchOptions::default()
                    };
                    variant(&mut opts, on);
                    let rep = bench(&opts, data)?;
                    w[i].push(rep.write_mb_s);
                    r[i].push(rep.read_mb_s);
                    o[i].push(overwrite_mb_s(&opts, data)?);
                }
            }
            let [wa, wb] = w.map(median);
            let [oa, ob] = o.map(median);
            let [ra, rb] = r.map(median);
            println!(
                "| {algo} | {mode} | {wa:.0} | {wb:.0} | {:.3} | {:.3} | {ra:.0} | {rb:.0} | {:.3} |",
                wb / wa,
                ob / oa,
                rb / ra
            );
        }
    }
    Ok(())
}

const USAGE: &str =
    "usage: engine_ratios FILE [--rounds N] [--scaling-only | --shared-cost | --reserve-cost | --mlock-cost] [ALGO...]
  FILE: pages, zstd-compressed if it ends in .zst (e.g. the shared corpus)
  ALGO: lz4, zstd, zstd:LEVEL, deflate, deflate:LEVEL (default: lz4 zstd:1 zstd:3 deflate:1)";

fn main() -> Result<(), String> {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    let scaling_only = std::env::args().any(|a| a == "--scaling-only");
    let shared_only = std::env::args().any(|a| a == "--shared-cost");
    let reserve_only = std::env::args().any(|a| a == "--reserve-cost");
    let mlock_only = std::env::args().any(|a| a == "--mlock-cost");
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(args.next().ok_or("no FILE given (--help: usage)")?);
    let mut algos = Vec::new();
    let mut rounds = 5;
    while let Some(a) = args.next() {
        if [
            "--scaling-only",
            "--shared-cost",
            "--reserve-cost",
            "--mlock-cost",
        ]
        .contains(&a.as_str())
        {
            continue;
        }
        if a == "--rounds" {
            rounds = args
                .next()
                .and_then(|n| n.parse().ok())
                .ok_or("--rounds needs a number")?;
        } else {
            algos.push(a.parse::<Algo>()?);
        }
    }
    if algos.is_empty() {
        algos = vec![Algo::Lz4, Algo::Zstd(1), Algo::Zstd(3), Algo::Deflate(1)];
    }
    let data = load_input(&path).map_err(|e| e.to_string())?;
    if shared_only {
        let shared = |o: &mut BenchOptions, on| o.shared = on;
        return ab_cost(&algos, rounds, &data, ["private", "shared"], shared);
    }
    if mlock_only {
        // The daemon's store for swap (shared memory, the reserve) with and
        // without locking it in RAM.
        let lock = |o: &mut BenchOptions, on| {
            o.shared = true;
            o.reserve = true;
            o.mlock = on;
        };
        return ab_cost(&algos, rounds, &data, ["unlocked", "mlock"], lock);
    }
    if reserve_only {
        // Both in shared memory, as the daemon runs: the reserve as the
        // daemon has it (here free memory is plenty), then as when free
        // memory is short (every zspage from the provisioner).
        let reserve = |o: &mut BenchOptions, on| {
            o.shared = true;
            o.reserve = on;
        };
        ab_cost(&algos, rounds, &data, ["shared", "reserve"], reserve)?;
        let forced = |o: &mut BenchOptions, on| {
            o.shared = true;
            o.reserve = on;
            o.reserve_free_below = u64::MAX;
        };
        return ab_cost(&algos, rounds, &data, ["shared", "reserve-only"], forced);
    }
    if !scaling_only {
        store_vs_codec(&algos, rounds, &data)?;
    }
    scaling(&algos, rounds, &data)?;
    Ok(())
}
