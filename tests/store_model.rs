//! Model-based test: random operation sequences against the store, checked
//! page by page against the model of `common::model`.

mod common;

use common::model::{self, Model, Op};
use common::real_pages;
use proptest::prelude::*;
use zblk::{Algo, Error, Mode, QueueCtx, Store, StoreConfig, PAGE_SIZE};

const PAGES: u64 = 48;

/// This test's own operations, besides writes, reads and discards.
#[derive(Debug, Clone)]
enum Own {
    WriteZeroes {
        page: u64,
        n: u64,
    },
    /// A 512-byte-aligned but not page-aligned request: must be refused.
    Misaligned {
        sector: u64,
    },
    /// A request reaching past the end: must be refused.
    OutOfRange {
        page: u64,
        n: u64,
    },
    /// Compaction (and, packed, rewriting sparse groups): content unchanged.
    Compact,
}

fn op() -> impl Strategy<Value = Op<Own>> {
    let range = model::range(PAGES, 20);
    prop_oneof![
        4 => model::write(PAGES, 20),
        3 => range.clone().prop_map(|(page, n)| Op::Read { page, n }),
        1 => range.clone().prop_map(|(page, n)| Op::Discard { page, n }),
        1 => range.prop_map(|(page, n)| Op::Own(Own::WriteZeroes { page, n })),
        1 => (1u64..PAGES * 8).prop_filter("not page aligned", |s| s % 8 != 0).prop_map(|sector| Op::Own(Own::Misaligned { sector })),
        1 => (0..PAGES).prop_map(|page| Op::Own(Own::OutOfRange { page, n: PAGES - page + 1 })),
        1 => Just(Op::Own(Own::Compact)),
    ]
}

fn config() -> impl Strategy<Value = (Algo, usize, Mode)> {
    (
        prop_oneof![Just(Algo::Lz4), Just(Algo::Zstd(1)), Just(Algo::Deflate(1))],
        prop_oneof![Just(1usize), Just(3), Just(8)],
        prop_oneof![Just(Mode::PerPage), Just(Mode::Packed)],
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn store_matches_model(
        (algo, group, mode) in config(),
        workers in 0usize..=1,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let real = real_pages();
        let mut cfg = StoreConfig::new(PAGES * PAGE_SIZE as u64);
        cfg.algo = algo;
        cfg.group_pages = group;
        cfg.mode = mode;
        // Compression workers (when idle) share requests' groups: the
        // model sees the same store either way.
        cfg.compress_workers = workers;
        let store = Store::new(cfg).unwrap();
        let mut ctx = store.new_ctx();
        let mut m = Model::new(PAGES);
        for op in ops {
            if let Some(own) = model::apply(&store, &mut ctx, &mut m, op, &real)? {
                apply_own(&store, &mut ctx, &mut m, own)?;
            }
            check_counters(&store, &m)?;
        }
    }
}

/// Applies one of this test's own operations to the store and the model.
fn apply_own(
    store: &Store,
    ctx: &mut QueueCtx,
    m: &mut Model,
    own: Own,
) -> Result<(), TestCaseError> {
    let off = |p: u64| p * PAGE_SIZE as u64;
    match own {
        Own::WriteZeroes { page: p, n } => {
            ctx.write_zeroes(off(p), n * PAGE_SIZE as u64).unwrap();
            m.clear(p, n);
        }
        Own::Misaligned { sector } => {
            let mut buf = vec![0u8; PAGE_SIZE];
            let e = ctx.read(sector * 512, &mut buf).unwrap_err();
            prop_assert!(matches!(e, Error::Misaligned { .. }), "{e:?}");
            prop_assert!(ctx.write(sector * 512, &buf).is_err());
            prop_assert!(ctx.discard(sector * 512, 512).is_err());
        }
        Own::OutOfRange { page: p, n } => {
            let buf = vec![1u8; (n as usize) * PAGE_SIZE];
            let e = ctx.write(off(p), &buf).unwrap_err();
            prop_assert!(matches!(e, Error::OutOfRange { .. }), "{e:?}");
            prop_assert!(ctx.discard(off(p), n * PAGE_SIZE as u64).is_err());
        }
        Own::Compact => {
            store.compact();
        }
    }
    Ok(())
}

/// The gauges follow from the model: every stored page counted once, same
/// pages separately, orig_data_size 4 KB per stored page (same-filled too, as in zram).
fn check_counters(store: &Store, m: &Model) -> Result<(), TestCaseError> {
    let s = store.stats();
    let stored = m.stored();
    let same = m
        .pages
        .iter()
        .flatten()
        .filter(|p| common::same_filled(&p.data))
        .count() as u64;
    prop_assert_eq!(s.counters.stored_pages, stored);
    prop_assert_eq!(s.counters.same_pages, same);
    prop_assert_eq!(s.counters.orig_data_size, stored * PAGE_SIZE as u64);
    prop_assert!(s.counters.compr_data_size <= s.counters.orig_data_size);
    prop_assert!(s.counters.huge_pages <= stored - same);
    if s.mode == Mode::PerPage {
        prop_assert_eq!(s.counters.packed_dead_bytes, 0);
    }
    Ok(())
}
