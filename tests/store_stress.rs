//! Concurrency stress: threads writing, reading, discarding and zeroing
//! overlapping ranges. Every page written carries its own identity (page
//! number, writer, sequence) and a body derived from it, so a read can be
//! checked against the set of versions that could legally be there: zeros,
//! or some whole version written for that very page. A torn, freed or
//! misplaced page fails the check.

mod common;

use common::Rng;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zblk::{Algo, Mode, Store, StoreConfig, PAGE_SIZE};

const PAGES: u64 = 64;

/// A version of `page`: header words, then a body in one of four shapes the
/// store treats differently (compressible, incompressible, same-filled).
fn version(page: u64, writer: u64, seq: u64) -> Vec<u8> {
    let id = (page << 40) | (writer << 32) | (seq & 0xffff_ffff);
    let mut out = Vec::with_capacity(PAGE_SIZE);
    match seq % 4 {
        // Same-filled: the word is the id itself (never zero: page >= 0, writer >= 1).
        0 => {
            return id
                .to_ne_bytes()
                .iter()
                .copied()
                .cycle()
                .take(PAGE_SIZE)
                .collect()
        }
        1 => {
            out.extend_from_slice(&id.to_ne_bytes());
            let mut r = Rng(id | 1);
            while out.len() < PAGE_SIZE {
                out.extend_from_slice(&r.next().to_ne_bytes());
            }
        }
        _ => {
            out.extend_from_slice(&id.to_ne_bytes());
            let text = format!("{id:x} is a compressible body; ");
            out.extend(text.bytes().cycle().take(PAGE_SIZE - 8));
        }
    }
    out
}

/// Is `got` a legal content for `page`?
fn legal(page: u64, got: &[u8]) -> bool {
    if got.iter().all(|&b| b == 0) {
        return true;
    }
    let id = u64::from_ne_bytes(got[..8].try_into().unwrap());
    let (p, w, s) = (id >> 40, (id >> 32) & 0xff, id & 0xffff_ffff);
    p == page && w >= 1 && got == version(p, w, s).as_slice()
}

fn stress(algo: Algo, group: usize, mode: Mode, threads: u64, secs: u64) {
    let mut cfg = StoreConfig::new(PAGES * PAGE_SIZE as u64);
    cfg.algo = algo;
    cfg.group_pages = group;
    cfg.mode = mode;
    let store = Store::new(cfg).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (1..=threads)
        .map(|w| {
            let (store, stop, reads) = (store.clone(), stop.clone(), reads.clone());
            std::thread::spawn(move || {
                let mut ctx = store.new_ctx();
                let mut rng = Rng(w * 0x9e37_79b9 + 1);
                let mut seq = 0u64;
                let mut buf = vec![0u8; 16 * PAGE_SIZE];
                while !stop.load(Ordering::Relaxed) {
                    let p = rng.below(PAGES);
                    let n = 1 + rng.below((PAGES - p).min(16));
                    let off = p * PAGE_SIZE as u64;
                    match rng.below(10) {
                        0..=3 => {
                            let data: Vec<u8> = (p..p + n)
                                .flat_map(|q| {
                                    seq += 1;
                                    version(q, w, seq)
                                })
                                .collect();
                            ctx.write(off, &data).unwrap();
                        }
                        4..=7 => {
                            let out = &mut buf[..(n as usize) * PAGE_SIZE];
                            ctx.read(off, out).unwrap();
                            for (i, pg) in out.chunks(PAGE_SIZE).enumerate() {
                                assert!(
                                    legal(p + i as u64, pg),
                                    "page {} holds an illegal version",
                                    p + i as u64
                                );
                            }
                            reads.fetch_add(n, Ordering::Relaxed);
                        }
                        8 => ctx.discard(off, n * PAGE_SIZE as u64).unwrap(),
                        _ => ctx.write_zeroes(off, n * PAGE_SIZE as u64).unwrap(),
                    }
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        // The compactor runs against the I/O all along.
        store.compact();
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("a stress thread failed");
    }
    assert!(
        reads.load(Ordering::Relaxed) > 1000,
        "the stress did too little to mean anything"
    );
    // Quiesced: the gauges must equal a full scan of the device.
    let mut ctx = store.new_ctx();
    let mut all = vec![0u8; PAGES as usize * PAGE_SIZE];
    ctx.read(0, &mut all).unwrap();
    let nonzero = all
        .chunks(PAGE_SIZE)
        .filter(|p| p.iter().any(|&b| b != 0))
        .count() as u64;
    let s = store.stats();
    assert_eq!(
        s.counters.stored_pages, nonzero,
        "stored_pages agrees with the content"
    );
    ctx.discard(0, PAGES * PAGE_SIZE as u64).unwrap();
    drop(ctx);
    assert_eq!(store.stats().counters.stored_pages, 0);
    assert_eq!(store.stats().mem_used_total, 0, "no object leaked");
}

#[test]
fn stress_lz4_grouped() {
    stress(Algo::Lz4, 8, Mode::PerPage, 4, 3);
}

#[test]
fn stress_zstd_per_page() {
    stress(Algo::Zstd(1), 1, Mode::PerPage, 3, 2);
}

#[test]
fn stress_packed_with_compactor() {
    stress(Algo::Zstd(1), 8, Mode::Packed, 4, 3);
}
