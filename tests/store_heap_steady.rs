//! A prefaulted queue context's heap stays where it is under a long mixed
//! load: the engine's I/O path (and its codecs' contexts) must not grow the
//! heap once serving, since on a swap device a fresh heap page is faulted
//! in when memory has run out (seen on 6.12: both queue threads in direct
//! reclaim from a write into a new page of zstd's workspace, 17 MB into
//! their malloc arena). Measured with glibc's `mallinfo2` (the C codecs'
//! allocations included): bytes the heap took from the system and bytes in
//! use, each allowed 1 MB of slack for the store's own threads (the drain
//! thread's batches), where a context that reallocates on the I/O path
//! would take more with every change of input size.

use zblk::{Algo, Mode, Store, StoreConfig, PAGE_SIZE};

/// Bytes every malloc arena took from the system, and bytes in use.
fn heap() -> (usize, usize) {
    // SAFETY: mallinfo2 only reads malloc's own counters.
    let m = unsafe { libc::mallinfo2() };
    (m.arena + m.hblkhd, m.uordblks)
}

fn page(seed: u64, kind: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..PAGE_SIZE)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match kind % 3 {
                0 => (i / 64) as u8 ^ seed as u8,
                1 => b"swap page of text "[(x % 18) as usize],
                _ => x as u8,
            }
        })
        .collect()
}

#[test]
fn a_long_mixed_load_does_not_grow_a_prefaulted_contexts_heap() {
    for (algo, mode) in [
        (Algo::Zstd(1), Mode::Packed),
        (Algo::Zstd(1), Mode::PerPage),
        (Algo::Lz4, Mode::Packed),
        (Algo::Lz4, Mode::PerPage),
    ] {
        let pages = 4096u64;
        let mut cfg = StoreConfig::new(pages * PAGE_SIZE as u64);
        cfg.algo = algo;
        cfg.mode = mode;
        let store = Store::new(cfg).expect("store");
        let mut ctx = store.new_ctx();
        ctx.prefault();
        let mut x = 12345u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut buf = vec![0u8; 8 * PAGE_SIZE];
        let mut run = |n: usize, rnd: &mut dyn FnMut() -> u64| {
            for _ in 0..n {
                let r = rnd();
                let len = 1 + (r % 8) as usize;
                let at = (r >> 8) % (pages - 8);
                let off = at * PAGE_SIZE as u64;
                match (r >> 40) % 4 {
                    0 | 1 => {
                        for (i, p) in buf[..len * PAGE_SIZE].chunks_mut(PAGE_SIZE).enumerate() {
                            p.copy_from_slice(&page(r ^ i as u64, r >> 50));
                        }
                        ctx.write(off, &buf[..len * PAGE_SIZE]).expect("write");
                    }
                    2 => ctx.read(off, &mut buf[..len * PAGE_SIZE]).expect("read"),
                    _ => ctx.discard(off, (len * PAGE_SIZE) as u64).expect("discard"),
                }
            }
        };
        run(20_000, &mut rnd);
        let before = heap();
        run(20_000, &mut rnd);
        let after = heap();
        assert!(
            after.0 <= before.0 + (1 << 20) && after.1 <= before.1 + (1 << 20),
            "{algo} {mode:?}: heap from the system {} -> {}, in use {} -> {}",
            before.0,
            after.0,
            before.1,
            after.1
        );
    }
}
