//! How long a recovery takes: a store in shared memory is filled with N MB
//! of real pages (the corpus, cycled), its process "dies"
//! (`zblk::debug_crash`: nothing freed, nothing flushed), and a new store
//! is recovered from its memfd. Usage:
//!
//!     recovery_time FILE [--mode per-page|packed] [--algo ALGO] [MB...]
//!
//! Prints one row per size: pages stored, memory, recovery time (the scan,
//! the slab's rebuild and the release of unused memory), and the time of a
//! full verifying read after it.

use std::path::PathBuf;
use std::time::Instant;
use zblk::{Algo, Mode, Store, StoreConfig, PAGE_SIZE};
use zblk_bench::engine::load_input;

struct Args {
    path: PathBuf,
    mode: Mode,
    algo: Algo,
    sizes: Vec<u64>,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let path = PathBuf::from(
        it.next()
            .ok_or("usage: recovery_time FILE [--mode M] [--algo A] [MB...]")?,
    );
    let (mut mode, mut algo, mut sizes) = (Mode::PerPage, Algo::Lz4, Vec::new());
    while let Some(a) = it.next() {
        match a.as_str() {
            "--mode" => mode = it.next().ok_or("--mode needs a value")?.parse()?,
            "--algo" => algo = it.next().ok_or("--algo needs a value")?.parse()?,
            mb => sizes.push(mb.parse().map_err(|_| format!("not a size in MB: {mb}"))?),
        }
    }
    if sizes.is_empty() {
        sizes = vec![100, 500, 1000];
    }
    Ok(Args {
        path,
        mode,
        algo,
        sizes,
    })
}

fn one(a: &Args, corpus: &[u8], mb: u64) -> Result<(), String> {
    let size = mb << 20;
    let mut cfg = StoreConfig::new(size);
    cfg.shared = true;
    cfg.mode = a.mode;
    cfg.algo = a.algo;
    let store = Store::new(cfg.clone()).map_err(|e| e.to_string())?;
    let mut ctx = store.new_ctx();
    let chunk = 64 * PAGE_SIZE;
    let mut off = 0u64;
    while off < size {
        let at = (off as usize) % (corpus.len() - chunk + 1) / PAGE_SIZE * PAGE_SIZE;
        ctx.write(off, &corpus[at..at + chunk])
            .map_err(|e| e.to_string())?;
        off += chunk as u64;
    }
    let before = store.stats();
    let fd = store
        .memory_fd()
        .ok_or("no memfd")?
        .try_clone_to_owned()
        .map_err(|e| e.to_string())?;
    std::mem::forget(ctx);
    zblk::debug_crash(store);
    let t0 = Instant::now();
    let store = Store::recover(cfg, fd).map_err(|e| e.to_string())?;
    let recover_ms = t0.elapsed().as_secs_f64() * 1e3;
    let after = store.stats();
    if after.counters.stored_pages != before.counters.stored_pages {
        return Err("stored_pages differ after recovery".into());
    }
    let mut ctx = store.new_ctx();
    let mut buf = vec![0u8; chunk];
    let t1 = Instant::now();
    let mut off = 0u64;
    while off < size {
        let at = (off as usize) % (corpus.len() - chunk + 1) / PAGE_SIZE * PAGE_SIZE;
        ctx.read(off, &mut buf).map_err(|e| e.to_string())?;
        if buf[..] != corpus[at..at + chunk] {
            return Err(format!("data differs at {off} after recovery"));
        }
        off += chunk as u64;
    }
    println!(
        "| {mb} | {} | {} | {} | {:.1} | {:.0} |",
        a.mode,
        after.counters.stored_pages,
        after.mem_used_total >> 20,
        recover_ms,
        t1.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

fn main() -> Result<(), String> {
    let a = args()?;
    let corpus = load_input(&a.path).map_err(|e| e.to_string())?;
    println!("| stored MB | mode | pages | mem_used_total MB | recovery ms | verifying read ms |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for &mb in &a.sizes {
        one(&a, &corpus, mb)?;
    }
    Ok(())
}
