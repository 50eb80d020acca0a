//! RAM saved by writeback, and the read latency of a written-back page
//! against one in RAM, for BENCHMARKS.md. Usage:
//!
//!     writeback_latency FILE [BACKING] [ALGO] [READS]
//!
//! Stores every page of FILE in two fresh per-page stores of ALGO (lz4 by
//! default): one keeps its pages in RAM, the other has the backing file
//! BACKING (default `/var/tmp/zblk-wb-bench`, made and sized here, removed
//! at the end) and writes every page back (`mark_idle` of all, then one
//! writeback of type `idle`). Prints the memory before and after, what was
//! written and how fast, then READS (default 20,000) single-page reads of
//! random pages, the same page from each store one after the other (so
//! that load on the machine falls on both alike), with their latency
//! percentiles. Every page read is checked against FILE.

use std::path::PathBuf;
use std::time::{Duration, Instant};
use zblk::{Algo, QueueCtx, Store, StoreConfig, Writeback, WritebackType, PAGE_SIZE};
use zblk_bench::engine::load_input;

const MB: f64 = 1024.0 * 1024.0;

/// A store of `data` (with `backing`, if given) and a context to use it.
fn filled(
    data: &[u8],
    algo: Algo,
    backing: Option<&PathBuf>,
) -> Result<(std::sync::Arc<Store>, QueueCtx), String> {
    let mut cfg = StoreConfig::new(data.len() as u64);
    cfg.algo = algo;
    cfg.backing = backing.cloned();
    let store = Store::new(cfg).map_err(|e| e.to_string())?;
    let mut ctx = store.new_ctx();
    for (i, chunk) in data.chunks(16 * PAGE_SIZE).enumerate() {
        let off = (i * 16 * PAGE_SIZE) as u64;
        ctx.write(off, chunk).map_err(|e| e.to_string())?;
    }
    ctx.flush_frees();
    store.settle_frees(Duration::from_secs(10));
    Ok((store, ctx))
}

/// xorshift64*: reproducible page choices without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Microseconds at quantile `q` of sorted `v`.
fn pct(v: &[Duration], q: f64) -> f64 {
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v[i].as_secs_f64() * 1e6
}

fn row(name: &str, mut v: Vec<Duration>) -> String {
    v.sort();
    format!(
        "| {name} | {:.1} | {:.1} | {:.1} | {:.1} |",
        pct(&v, 0.5),
        pct(&v, 0.9),
        pct(&v, 0.99),
        pct(&v, 0.999)
    )
}

/// Reads page `p` through `ctx`, checks it, returns the time it took.
fn timed_read(ctx: &mut QueueCtx, data: &[u8], p: u64, buf: &mut [u8]) -> Result<Duration, String> {
    let t0 = Instant::now();
    ctx.read(p * PAGE_SIZE as u64, buf)
        .map_err(|e| e.to_string())?;
    let dt = t0.elapsed();
    let at = p as usize * PAGE_SIZE;
    if buf != &data[at..at + PAGE_SIZE] {
        return Err(format!("page {p} differs"));
    }
    Ok(dt)
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: writeback_latency FILE [BACKING] [ALGO] [READS]";
    let file = PathBuf::from(args.next().ok_or(usage)?);
    let bd = PathBuf::from(args.next().unwrap_or("/var/tmp/zblk-wb-bench".into()));
    let algo: Algo = args.next().map_or(Ok(Algo::Lz4), |a| a.parse())?;
    let reads: u64 = args
        .next()
        .map_or(Ok(20_000), |a| a.parse().map_err(|_| usage))?;
    let data = load_input(&file).map_err(|e| e.to_string())?;
    let f = std::fs::File::create(&bd).map_err(|e| format!("{}: {e}", bd.display()))?;
    f.set_len(data.len() as u64).map_err(|e| e.to_string())?;
    drop(f);

    let (ram, mut ram_ctx) = filled(&data, algo, None)?;
    let (wb, mut wb_ctx) = filled(&data, algo, Some(&bd))?;
    let before = wb.stats();
    wb.mark_idle(None).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let r = wb
        .writeback(&Writeback {
            select: WritebackType::Idle.into(),
            limit: 0,
        })
        .map_err(|e| e.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    wb.settle_frees(Duration::from_secs(10));
    wb.compact();
    let after = wb.stats();
    println!(
        "{algo}: {} pages, {} stored; written back {} pages ({:.1} MB compressed, {} blocks) in {:.2} s ({:.0} pages/s)",
        data.len() / PAGE_SIZE,
        before.counters.stored_pages,
        r.written,
        r.bytes as f64 / MB,
        r.blocks,
        secs,
        r.written as f64 / secs
    );
    println!(
        "mem_used_total {:.1} -> {:.1} MB; compr_data_size {:.1} -> {:.1} MB; bd_bytes {:.1} MB, bd_used_bytes {:.1} MB",
        before.mem_used_total as f64 / MB,
        after.mem_used_total as f64 / MB,
        before.counters.compr_data_size as f64 / MB,
        after.counters.compr_data_size as f64 / MB,
        after.counters.bd_bytes as f64 / MB,
        after.bd_used_bytes as f64 / MB
    );

    let pages = (data.len() / PAGE_SIZE) as u64;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut buf = vec![0u8; PAGE_SIZE];
    let (mut in_ram, mut backed) = (Vec::new(), Vec::new());
    for _ in 0..reads {
        let p = rng.below(pages);
        in_ram.push(timed_read(&mut ram_ctx, &data, p, &mut buf)?);
        backed.push(timed_read(&mut wb_ctx, &data, p, &mut buf)?);
    }
    let bd_reads = wb.stats().counters.bd_reads;
    println!("\n{reads} random single-page reads each; backing reads {bd_reads}\n");
    println!("| page | p50 us | p90 us | p99 us | p99.9 us |");
    println!("| --- | --- | --- | --- | --- |");
    println!("{}", row("in RAM", in_ram));
    println!("{}", row("written back", backed));
    drop((ram_ctx, wb_ctx, ram, wb));
    std::fs::remove_file(&bd).map_err(|e| e.to_string())?;
    Ok(())
}
