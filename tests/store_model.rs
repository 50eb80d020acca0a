//! Model-based test: random operation sequences against the store, checked
//! page by page against a plain `Vec<Option<page>>`.

mod common;

use common::{page, real_pages, Content};
use proptest::prelude::*;
use zblk::{Algo, Error, Mode, Store, StoreConfig, PAGE_SIZE};

const PAGES: u64 = 48;

#[derive(Debug, Clone)]
enum Op {
    Write {
        page: u64,
        contents: Vec<Content>,
    },
    Read {
        page: u64,
        n: u64,
    },
    Discard {
        page: u64,
        n: u64,
    },
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

fn content() -> impl Strategy<Value = Content> {
    prop_oneof![
        Just(Content::Zeros),
        any::<u64>().prop_map(Content::SameWord),
        any::<u64>().prop_map(Content::Text),
        (0usize..96).prop_map(Content::Real),
        any::<u64>().prop_map(Content::Random),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let range = (0..PAGES).prop_flat_map(|p| (Just(p), 1..=(PAGES - p).min(20)));
    prop_oneof![
        4 => (0..PAGES).prop_flat_map(|p| (Just(p), prop::collection::vec(content(), 1..=((PAGES - p).min(20) as usize))))
            .prop_map(|(page, contents)| Op::Write { page, contents }),
        3 => range.clone().prop_map(|(page, n)| Op::Read { page, n }),
        1 => range.clone().prop_map(|(page, n)| Op::Discard { page, n }),
        1 => range.prop_map(|(page, n)| Op::WriteZeroes { page, n }),
        1 => (1u64..PAGES * 8).prop_filter("not page aligned", |s| s % 8 != 0).prop_map(|sector| Op::Misaligned { sector }),
        1 => (0..PAGES).prop_map(|page| Op::OutOfRange { page, n: PAGES - page + 1 }),
        1 => Just(Op::Compact),
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
    fn store_matches_model((algo, group, mode) in config(), ops in prop::collection::vec(op(), 1..60)) {
        let real = real_pages();
        let mut cfg = StoreConfig::new(PAGES * PAGE_SIZE as u64);
        cfg.algo = algo;
        cfg.group_pages = group;
        cfg.mode = mode;
        let store = Store::new(cfg).unwrap();
        let mut ctx = store.new_ctx();
        let mut model: Vec<Option<Vec<u8>>> = vec![None; PAGES as usize];
        let off = |p: u64| p * PAGE_SIZE as u64;
        for op in ops {
            match op {
                Op::Write { page: p, contents } => {
                    let data: Vec<u8> = contents.iter().flat_map(|&c| page(c, &real)).collect();
                    ctx.write(off(p), &data).unwrap();
                    for (i, pg) in data.chunks(PAGE_SIZE).enumerate() {
                        model[p as usize + i] = Some(pg.to_vec());
                    }
                }
                Op::Read { page: p, n } => {
                    let mut buf = vec![0xAAu8; (n as usize) * PAGE_SIZE];
                    ctx.read(off(p), &mut buf).unwrap();
                    for (i, got) in buf.chunks(PAGE_SIZE).enumerate() {
                        let want = model[p as usize + i].clone().unwrap_or_else(|| vec![0; PAGE_SIZE]);
                        prop_assert!(got == &want[..], "page {} differs", p as usize + i);
                    }
                }
                Op::Discard { page: p, n } | Op::WriteZeroes { page: p, n } => {
                    if matches!(op, Op::Discard { .. }) {
                        ctx.discard(off(p), n * PAGE_SIZE as u64).unwrap();
                    } else {
                        ctx.write_zeroes(off(p), n * PAGE_SIZE as u64).unwrap();
                    }
                    for m in &mut model[p as usize..(p + n) as usize] {
                        *m = None;
                    }
                }
                Op::Misaligned { sector } => {
                    let mut buf = vec![0u8; PAGE_SIZE];
                    let e = ctx.read(sector * 512, &mut buf).unwrap_err();
                    prop_assert!(matches!(e, Error::Misaligned { .. }), "{e:?}");
                    prop_assert!(ctx.write(sector * 512, &buf).is_err());
                    prop_assert!(ctx.discard(sector * 512, 512).is_err());
                }
                Op::OutOfRange { page: p, n } => {
                    let buf = vec![1u8; (n as usize) * PAGE_SIZE];
                    let e = ctx.write(off(p), &buf).unwrap_err();
                    prop_assert!(matches!(e, Error::OutOfRange { .. }), "{e:?}");
                    prop_assert!(ctx.discard(off(p), n * PAGE_SIZE as u64).is_err());
                }
                Op::Compact => {
                    store.compact();
                }
            }
            check_counters(&store, &model)?;
        }
    }
}

/// The gauges follow from the model: every stored page counted once, same
/// pages separately, orig_data_size 4 KB per stored page (same-filled too, as in zram).
fn check_counters(store: &Store, model: &[Option<Vec<u8>>]) -> Result<(), TestCaseError> {
    let s = store.stats();
    let stored = model.iter().flatten().count() as u64;
    let same = model
        .iter()
        .flatten()
        .filter(|p| common::same_filled(p))
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
