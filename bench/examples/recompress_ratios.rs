//! RAM saved by recompression, for BENCHMARKS.md. Usage:
//!
//!     recompress_ratios FILE [--packed] [PRIMARY [SECONDARY...]]
//!
//! Stores every page of FILE in a fresh per-page store (packed, groups of
//! 8, with `--packed`) of PRIMARY (lz4 by default), then recompresses every
//! page with each SECONDARY in turn (a fresh store each; a packed store
//! into packed groups), and prints a markdown table: compressed bytes and
//! `mem_used_total` before and after, pages recompressed, and the time the
//! pass took. Every page is read back and checked after the pass.

use std::path::PathBuf;
use std::time::Duration;
use std::time::Instant;
use zblk::{Algo, Mode, Recompress, RecompressType, Store, StoreConfig};
use zblk_bench::engine::load_input;

const MB: f64 = 1024.0 * 1024.0;

fn parse(s: &str) -> Result<Algo, String> {
    s.parse()
}

/// Lets the drain free what was queued, then compacts.
fn settle_and_compact(store: &Store) {
    store.settle_frees(Duration::from_secs(10));
    store.compact();
}

fn row(data: &[u8], mode: Mode, primary: Algo, secondary: Algo) -> Result<String, String> {
    let mut cfg = StoreConfig::new(data.len() as u64);
    cfg.algo = primary;
    cfg.mode = mode;
    let store = Store::new(cfg).map_err(|e| e.to_string())?;
    let mut ctx = store.new_ctx();
    for (i, chunk) in data.chunks(16 * zblk::PAGE_SIZE).enumerate() {
        let off = (i * 16 * zblk::PAGE_SIZE) as u64;
        ctx.write(off, chunk).map_err(|e| e.to_string())?;
    }
    ctx.flush_frees();
    settle_and_compact(&store);
    let before = store.stats();
    let t0 = Instant::now();
    let r = store
        .recompress(&Recompress {
            algos: vec![secondary],
            kind: RecompressType::All,
            threshold: 0,
            max_pages: 0,
            pages: Vec::new(),
        })
        .map_err(|e| e.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    settle_and_compact(&store);
    let after = store.stats();
    let mut back = vec![0u8; data.len()];
    ctx.read(0, &mut back).map_err(|e| e.to_string())?;
    if back != data {
        return Err(format!("{secondary}: pages differ after recompression"));
    }
    let (cb, ca) = (
        before.counters.compr_data_size,
        after.counters.compr_data_size,
    );
    let (mb, ma) = (before.mem_used_total, after.mem_used_total);
    Ok(format!(
        "| {mode} {primary} | {secondary} | {} of {} | {:.1} -> {:.1} MB ({:+.1} %) | {:.1} -> {:.1} MB ({:+.1} %) | {:.2} s |",
        r.recompressed,
        r.tried,
        cb as f64 / MB,
        ca as f64 / MB,
        (ca as f64 / cb as f64 - 1.0) * 100.0,
        mb as f64 / MB,
        ma as f64 / MB,
        (ma as f64 / mb as f64 - 1.0) * 100.0,
        secs
    ))
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let file = PathBuf::from(
        args.next()
            .ok_or("usage: recompress_ratios FILE [--packed] [PRIMARY [SECONDARY...]]")?,
    );
    let mut args = args.peekable();
    let mode = if args.next_if(|a| a == "--packed").is_some() {
        Mode::Packed
    } else {
        Mode::PerPage
    };
    let primary = args.next().map_or(Ok(Algo::Lz4), |a| parse(&a))?;
    let mut secondaries: Vec<Algo> = args.map(|a| parse(&a)).collect::<Result<_, _>>()?;
    if secondaries.is_empty() {
        secondaries = vec![
            Algo::Zstd(3),
            Algo::Zstd(9),
            Algo::Zstd(19),
            Algo::Deflate(9),
            Algo::Deflate(12),
        ];
    }
    let data = load_input(&file).map_err(|e| e.to_string())?;
    println!(
        "| primary | secondary | pages recompressed | compr_data_size | mem_used_total | pass |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for s in secondaries {
        println!("{}", row(&data, mode, primary, s)?);
    }
    Ok(())
}
