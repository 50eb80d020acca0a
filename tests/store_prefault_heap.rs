//! After `QueueCtx::prefault`, a packed group's write and read take no new
//! heap memory: the codec's contexts were sized by the prefault's own group
//! (zstd sizes its compression workspace to the input, so a one-page
//! prefault left the first group's write to allocate it, on a queue thread,
//! when memory has run out). Measured with glibc's `mallinfo2`, which sees
//! the C codecs' allocations too; one test in its own binary, so no other
//! thread allocates meanwhile. (Before the group prefault, zstd:1's first
//! group of 8 took 108,016 bytes; with it, a group of 3 or 4 pages still
//! grew zstd's workspace, which now has a fixed size; what is left is the
//! store's own bookkeeping, a few hundred bytes.)

mod common;

use common::heap_bytes;
use zblk::{Algo, Mode, Store, StoreConfig, PAGE_SIZE};

fn group(seed: u8, pages: usize) -> Vec<u8> {
    (0..pages * PAGE_SIZE)
        .map(|i| (i as u8).wrapping_mul(seed) ^ (i / 64) as u8 ^ (i / 4096) as u8)
        .collect()
}

#[test]
fn a_prefaulted_context_writes_and_reads_packed_groups_of_any_size_without_new_heap() {
    for algo in [Algo::Zstd(1), Algo::Zstd(3), Algo::Lz4, Algo::Deflate(1)] {
        let mut cfg = StoreConfig::new(256 * PAGE_SIZE as u64);
        cfg.algo = algo;
        cfg.mode = Mode::Packed;
        let store = Store::new(cfg).expect("store");
        let g = store.config().group_pages;
        let mut ctx = store.new_ctx();
        ctx.prefault();
        let before = heap_bytes().1;
        // Every group size: zstd's workspace for 3-4 pages is larger than
        // for 8 (213 against 177 KB at level 1).
        let mut at = 0u64;
        for k in (1..=g).rev() {
            let data = group(7 + k as u8, k);
            let mut back = vec![0u8; data.len()];
            ctx.write(at, &data).expect("write");
            ctx.read(at, &mut back).expect("read");
            assert!(back == data, "{algo}: group of {k} read back wrong");
            at += (k * PAGE_SIZE) as u64;
        }
        let grown = heap_bytes().1.saturating_sub(before);
        assert!(
            grown < 16 << 10,
            "{algo}: groups after the prefault took {grown} more bytes of heap"
        );
    }
}
