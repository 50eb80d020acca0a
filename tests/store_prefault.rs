//! `QueueCtx::prefault`: faulting in a context's memory before its first
//! request stores nothing, counts nothing, and leaves the context serving
//! exactly as one that never prefaulted, for every codec and mode.

use zblk::{Algo, Mode, Store, StoreConfig, PAGE_SIZE};

fn page(seed: u8) -> Vec<u8> {
    (0..PAGE_SIZE)
        .map(|i| (i as u8).wrapping_mul(seed) ^ (i / 64) as u8)
        .collect()
}

#[test]
fn prefault_stores_and_counts_nothing_and_the_context_still_serves() {
    for algo in [Algo::Lz4, Algo::Zstd(1), Algo::Deflate(1), Algo::None] {
        for mode in [Mode::PerPage, Mode::Packed] {
            let mut cfg = StoreConfig::new(64 * PAGE_SIZE as u64);
            cfg.algo = algo;
            cfg.mode = mode;
            let Ok(store) = Store::new(cfg) else {
                continue; // a combination the engine refuses (none + packed)
            };
            let mut ctx = store.new_ctx();
            ctx.prefault();
            let c = store.stats().counters;
            assert_eq!((c.stored_pages, c.num_writes, c.num_reads), (0, 0, 0));
            assert_eq!(store.stats().mem_used_total, 0, "{algo} {mode:?}");
            let data: Vec<u8> = (0..8u8).flat_map(|i| page(i + 3)).collect();
            ctx.write(0, &data).expect("write after prefault");
            let mut back = vec![0xA5; data.len()];
            ctx.read(0, &mut back).expect("read after prefault");
            assert!(back == data, "{algo} {mode:?}: pages differ after prefault");
            // A second prefault, with pages stored, changes nothing either.
            ctx.prefault();
            back.fill(0xA5);
            ctx.read(0, &mut back)
                .expect("read after a second prefault");
            assert!(back == data, "{algo} {mode:?}");
        }
    }
}
