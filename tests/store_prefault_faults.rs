//! After `QueueCtx::prefault`, reading packed zstd groups back takes no page
//! fault on the reading thread: zstd's decompression context is faulted in
//! with the codec (`ZSTD_initStaticDCtx`). zstd's own context is one heap
//! block touched only as used, and a group whose literals went to its
//! literal buffer faulted in new pages there (a queue thread in reclaim
//! from that write, 7.3 whole machine). Counted with `getrusage`'s minor
//! faults for this thread; `ZBLK_ZSTD_CCTX=dynamic` (zstd's own contexts)
//! shows the faults this test exists to catch. One test in its own binary:
//! it sets an environment variable.

mod common;

use common::{thread_faults, Rng};
use zblk::{Algo, Mode, Store, StoreConfig, PAGE_SIZE};

/// Pages of random letters from a 16-letter alphabet: no matches, so all
/// literals (a whole group's worth), Huffman-coded to half their size.
fn letters(seed: u64, pages: usize) -> Vec<u8> {
    let mut rng = Rng(seed);
    (0..pages * PAGE_SIZE)
        .map(|_| b'a' + rng.below(16) as u8)
        .collect()
}

/// Faults taken by reading back 64 packed groups written after a prefault.
fn read_faults() -> u64 {
    let mut cfg = StoreConfig::new(1024 * PAGE_SIZE as u64);
    cfg.algo = Algo::Zstd(1);
    cfg.mode = Mode::Packed;
    let store = Store::new(cfg).expect("store");
    let g = store.config().group_pages;
    let mut ctx = store.new_ctx();
    ctx.prefault();
    let groups: Vec<Vec<u8>> = (0..64).map(|i| letters(i + 1, g)).collect();
    for (i, d) in groups.iter().enumerate() {
        ctx.write((i * g * PAGE_SIZE) as u64, d).expect("write");
    }
    let mut back = vec![1u8; g * PAGE_SIZE];
    let before = thread_faults();
    for (i, d) in groups.iter().enumerate() {
        ctx.read((i * g * PAGE_SIZE) as u64, &mut back)
            .expect("read");
        assert!(back == *d, "group {i} read back wrong");
    }
    thread_faults() - before
}

#[test]
fn reading_packed_zstd_groups_after_the_prefault_takes_no_fault() {
    // Each on a thread of its own, kept alive until both ran, so each in
    // a fresh malloc arena (glibc hands a new thread the arena of one that
    // ended): memory the process never touched, as in a daemon that just
    // started.
    let hold = std::sync::Arc::new(std::sync::Barrier::new(3));
    let mut threads = Vec::new();
    let mut faults = Vec::new();
    for dynamic in [true, false] {
        if dynamic {
            std::env::set_var("ZBLK_ZSTD_CCTX", "dynamic");
        } else {
            std::env::remove_var("ZBLK_ZSTD_CCTX");
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let hold = hold.clone();
        threads.push(std::thread::spawn(move || {
            let _ = tx.send(read_faults());
            hold.wait();
        }));
        // The codecs read the variable when made: this thread's are made.
        faults.push(rx.recv().expect("faults"));
    }
    hold.wait();
    for t in threads {
        t.join().expect("thread");
    }
    let (dynamic, fixed) = (faults[0], faults[1]);
    eprintln!("minor faults reading back: fixed contexts {fixed}, zstd's own {dynamic}");
    assert_eq!(fixed, 0, "fixed contexts: {fixed} faults");
}
