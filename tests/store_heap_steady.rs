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

mod common;

use common::{heap_bytes, Rng};
use zblk::{Algo, Mode, Store, StoreConfig, PAGE_SIZE};

fn page(seed: u64, kind: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    (0..PAGE_SIZE)
        .map(|i| match kind % 3 {
            0 => (i / 64) as u8 ^ seed as u8,
            1 => b"swap page of text "[rng.below(18) as usize],
            _ => rng.next() as u8,
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
        let mut rng = Rng(12345);
        let mut buf = vec![0u8; 8 * PAGE_SIZE];
        let mut run = |n: usize, rng: &mut Rng| {
            for _ in 0..n {
                let r = rng.next();
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
        run(20_000, &mut rng);
        let before = heap_bytes();
        run(20_000, &mut rng);
        let after = heap_bytes();
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
