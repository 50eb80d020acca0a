//! The size classes' vectors (the zspage table, the fullness groups'
//! lists) hold only memory already faulted in (its own test binary: the
//! provisioner's stall point is process-wide). A writer that grew them
//! itself while memory was plentiful and the provisioner lagged must not,
//! once memory is short, push onto capacity that growth left untouched:
//! a queue thread's fault there is reclaim by an I/O flusher, which
//! stalled a guest.

mod common;

use common::{keep_heap, page, thread_faults, Content};
use zblk::testing::faults::stall_provisioner;
use zblk::{Store, StoreConfig, PAGE_SIZE};

/// Pages written: incompressible, so all in one class, whose vectors grow
/// to megabytes.
const N: usize = 40_000;

fn write(ctx: &mut zblk::QueueCtx, pages: std::ops::Range<usize>) {
    for p in pages.step_by(8) {
        let d: Vec<u8> = (p..p + 8)
            .flat_map(|q| page(Content::Random(q as u64 + 1), &[]))
            .collect();
        ctx.write((p * PAGE_SIZE) as u64, &d).unwrap();
    }
}

#[test]
fn a_writer_that_grew_the_class_vectors_faults_nothing_once_memory_is_short() {
    keep_heap();
    let mut cfg = StoreConfig::new((N * PAGE_SIZE) as u64);
    cfg.shared = true;
    cfg.reserve = true;
    cfg.reserve_free_below = 1;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.new_ctx();
    ctx.prefault();
    // Memory plentiful and the provisioner behind: the writer grows the
    // class's vectors itself.
    stall_provisioner(true);
    write(&mut ctx, 0..N / 2);
    stall_provisioner(false);
    store.debug_set_reserve_free_below(u64::MAX);
    let mut back = vec![0u8; PAGE_SIZE];
    ctx.read(0, &mut back).unwrap();
    let before = thread_faults();
    write(&mut ctx, N / 2..N);
    let faults = thread_faults() - before;
    assert!(faults < 8, "{faults} faults writing once memory ran short");
    assert_eq!(store.stats().reserve_refusals, 0);
}
