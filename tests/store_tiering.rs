//! Model-based test of idle tracking and recompression: random writes,
//! reads, discards, clock steps, idle marking and recompressions against a
//! model that keeps every page's content, last access and idle mark; every
//! read is checked against it, and so is the `idle_pages` gauge after each
//! step. Heap and shared-memory stores; a shared one is then "killed" and
//! recovered, and must read back the same, idle marks and all.

mod common;

use common::model::{self, check_model_gauges, verify_all, Model, Op, STEP};
use common::{crash_and_recover, page, real_pages, Content};
use proptest::prelude::*;
use zblk::{
    Algo, Mode, QueueCtx, Recompress, RecompressType, Store, StoreConfig, MIN_SAVING_PERCENT,
    PAGE_SIZE,
};

const PAGES: u64 = 40;
const P: u64 = PAGE_SIZE as u64;

/// This test's own operation: a recompression with the case's secondary
/// algorithm.
#[derive(Debug, Clone)]
struct Recompression {
    kind: RecompressType,
    threshold: usize,
    max_pages: u64,
}

fn op() -> impl Strategy<Value = Op<Recompression>> {
    let range = model::range(PAGES, 12);
    let kind = prop_oneof![
        Just(RecompressType::All),
        Just(RecompressType::Idle),
        Just(RecompressType::Huge),
        Just(RecompressType::HugeIdle),
    ];
    prop_oneof![
        4 => model::write(PAGES, 12),
        3 => range.clone().prop_map(|(page, n)| Op::Read { page, n }),
        1 => range.prop_map(|(page, n)| Op::Discard { page, n }),
        2 => (1u64..4).prop_map(|steps| Op::Tick { steps }),
        2 => prop::option::of(0u64..4).prop_map(|steps| Op::MarkIdle { steps }),
        2 => (kind, prop_oneof![Just(0usize), Just(200), Just(3000)], prop_oneof![Just(0u64), Just(3)])
            .prop_map(|(kind, threshold, max_pages)| Op::Own(Recompression { kind, threshold, max_pages })),
    ]
}

fn config(primary: Algo, shared: bool) -> StoreConfig {
    let mut cfg = StoreConfig::new(PAGES * P);
    cfg.algo = primary;
    cfg.shared = shared;
    cfg
}

fn config_in(primary: Algo, shared: bool, mode: Mode) -> StoreConfig {
    let mut cfg = config(primary, shared);
    cfg.mode = mode;
    cfg
}

/// Applies `op` to the store and the model; a recompression with
/// `secondary`.
fn apply(
    store: &Store,
    ctx: &mut QueueCtx,
    secondary: Algo,
    m: &mut Model,
    op: Op<Recompression>,
    real: &[u8],
) -> Result<(), TestCaseError> {
    let Some(Recompression {
        kind,
        threshold,
        max_pages,
    }) = model::apply(store, ctx, m, op, real)?
    else {
        return Ok(());
    };
    let before = store.stats().counters;
    let r = store
        .recompress(&Recompress {
            algos: vec![secondary],
            kind,
            threshold,
            max_pages,
            pages: Vec::new(),
        })
        .unwrap();
    let after = store.stats().counters;
    prop_assert!(r.recompressed <= r.tried);
    if max_pages > 0 {
        prop_assert!(r.tried <= max_pages);
    }
    let idle = m.idle();
    if kind == RecompressType::Idle {
        prop_assert!(r.tried <= idle, "only idle pages are tried");
    }
    prop_assert_eq!(
        after.recompressed_pages,
        before.recompressed_pages + r.recompressed
    );
    prop_assert_eq!(
        before.compr_data_size - after.compr_data_size,
        r.saved_bytes,
        "compr_data_size drops by what was saved"
    );
    // Every page kept is at least MIN_SAVING_PERCENT smaller.
    prop_assert!(
        r.saved_bytes * 100 >= r.recompressed * MIN_SAVING_PERCENT as u64,
        "{r:?}"
    );
    Ok(())
}

fn check_gauges(store: &Store, m: &Model) -> Result<(), TestCaseError> {
    let c = check_model_gauges(store, m)?.counters;
    prop_assert!(c.recompressed_pages <= c.stored_pages - c.same_pages);
    Ok(())
}

fn algos() -> impl Strategy<Value = (Algo, Algo)> {
    prop_oneof![
        Just((Algo::Lz4, Algo::Zstd(9))),
        Just((Algo::Lz4, Algo::Deflate(9))),
        Just((Algo::Lz4, Algo::Lz4Hc(9))),
        Just((Algo::Lz4Hc(12), Algo::Zstd(3))),
        Just((Algo::Zstd(1), Algo::Zstd(19))),
        Just((Algo::Deflate(1), Algo::Lz4)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn idle_and_recompression_match_the_model(
        (primary, secondary) in algos(),
        shared in any::<bool>(),
        mode in prop_oneof![Just(Mode::PerPage), Just(Mode::Packed)],
        ops in prop::collection::vec(op(), 1..50),
    ) {
        let real = real_pages();
        let store = Store::new(config_in(primary, shared, mode)).unwrap();
        let mut ctx = store.new_ctx();
        let mut m = Model::new(PAGES);
        for op in ops {
            apply(&store, &mut ctx, secondary, &mut m, op, &real)?;
            check_gauges(&store, &m)?;
        }
        if shared {
            let before = store.stats().counters;
            let store = crash_and_recover(store, ctx, config_in(primary, true, mode));
            let after = store.stats();
            prop_assert_eq!(after.recovery_dropped, 0);
            prop_assert_eq!(after.counters.recompressed_pages, before.recompressed_pages);
            prop_assert_eq!(after.counters.compr_data_size, before.compr_data_size);
            check_gauges(&store, &m)?;
            ctx = store.new_ctx();
            verify_all(&mut ctx, &m)?;
        } else {
            verify_all(&mut ctx, &m)?;
        }
    }
}

/// Recompression refuses what it cannot do, with a reason, and changes
/// nothing.
#[test]
fn recompression_refuses_the_primary_and_a_fourth_secondary() {
    let p = |algo| Recompress {
        algos: vec![algo],
        kind: RecompressType::All,
        threshold: 0,
        max_pages: 0,
        pages: Vec::new(),
    };
    let store = Store::new(config(Algo::Lz4, false)).unwrap();
    let e = store.recompress(&p(Algo::Lz4)).unwrap_err();
    assert!(e.to_string().contains("differ"), "{e}");
    let empty = Recompress {
        algos: vec![],
        ..p(Algo::Zstd(9))
    };
    assert!(store.recompress(&empty).is_err());
    for a in [
        Algo::Zstd(9),
        Algo::Deflate(9),
        Algo::Lz4Hc(9),
        Algo::Zstd(9),
    ] {
        store.recompress(&p(a)).unwrap();
    }
    let e = store.recompress(&p(Algo::Zstd(19))).unwrap_err();
    assert!(e.to_string().contains("zstd:9 deflate:9 lz4hc"), "{e}");
    assert_eq!(store.stats().recompress_algorithm, "zstd:9 deflate:9 lz4hc");
    let e = store.mark_idle(Some(1 << 30)).unwrap_err();
    assert!(e.to_string().contains("194 days"), "{e}");
}

/// Real memory pages compress better with zstd:19 than with lz4: most are
/// recompressed, the memory they hold drops, and every page reads back.
#[test]
fn recompression_of_real_pages_saves_memory() {
    let real = real_pages();
    let n = (real.len() / PAGE_SIZE) as u64;
    let mut cfg = StoreConfig::new(n * P);
    cfg.algo = Algo::Lz4;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.new_ctx();
    ctx.write(0, &real).unwrap();
    let before = store.stats().counters;
    // Nothing is idle yet: an idle recompression tries nothing.
    let idle_only = Recompress {
        algos: vec![Algo::Zstd(19)],
        kind: RecompressType::Idle,
        threshold: 0,
        max_pages: 0,
        pages: Vec::new(),
    };
    assert_eq!(store.recompress(&idle_only).unwrap().tried, 0);
    store.debug_advance_clock(600);
    // Pages read after the clock moved are young again.
    let mut buf = vec![0u8; 4 * PAGE_SIZE];
    ctx.read(0, &mut buf).unwrap();
    assert_eq!(store.mark_idle(Some(300)).unwrap(), before.stored_pages - 4);
    let r = store.recompress(&idle_only).unwrap();
    let after = store.stats().counters;
    assert_eq!(r.tried, before.stored_pages - before.same_pages - 4);
    assert!(r.recompressed * 2 > r.tried, "{r:?}");
    assert_eq!(after.recompressed_pages, r.recompressed);
    assert_eq!(after.recompress_saved_bytes, r.saved_bytes);
    assert_eq!(
        before.compr_data_size - after.compr_data_size,
        r.saved_bytes
    );
    assert_eq!(after.idle_pages, before.stored_pages - 4, "marks survive");
    let mut back = vec![0u8; real.len()];
    ctx.read(0, &mut back).unwrap();
    assert!(back == real);
    assert_eq!(store.stats().counters.idle_pages, 0, "reads clear marks");
    // A pass over all pages finds only the four young ones left to the
    // primary, and does not recompress a page twice.
    let again = store
        .recompress(&Recompress {
            kind: RecompressType::All,
            ..idle_only.clone()
        })
        .unwrap();
    assert!(again.recompressed <= 4, "{again:?}");
    // Tried again: the pages kept as they were, less the huge ones, which
    // the first pass marked incompressible (zram's ZRAM_INCOMPRESSIBLE).
    let huge = after.huge_pages;
    assert!(again.tried <= r.tried - r.recompressed + 4, "{again:?}");
    assert!(
        again.tried + huge >= r.tried - r.recompressed + 4,
        "{again:?}"
    );
    // Every huge page has been tried once now: none is tried again.
    let huge_again = store
        .recompress(&Recompress {
            kind: RecompressType::Huge,
            ..idle_only
        })
        .unwrap();
    assert_eq!(huge_again.tried, 0, "{huge_again:?}");
}

#[test]
fn remark_idle_marks_exactly_the_pages_that_old() {
    let store = Store::new(config(Algo::Lz4, false)).unwrap();
    let mut ctx = store.new_ctx();
    let text = page(Content::Text(7), &[]);
    for p in 0..4 {
        ctx.write(p * P, &text).unwrap();
    }
    store.debug_advance_clock(STEP);
    for p in 4..6 {
        ctx.write(p * P, &text).unwrap();
    }
    let idle = |s: &Store| s.stats().counters.idle_pages;
    assert_eq!(store.mark_idle(None).unwrap(), 6);
    // The two young pages lose the mark `--all` gave them.
    assert_eq!(store.remark_idle(STEP / 2).unwrap(), (0, 2));
    assert_eq!(idle(&store), 4);
    let mut back = vec![0u8; PAGE_SIZE];
    ctx.read(0, &mut back).unwrap();
    assert_eq!(idle(&store), 3, "a read clears the mark");
    store.debug_advance_clock(STEP);
    // Page 0 (read), 4 and 5 (written) are old now too.
    assert_eq!(store.remark_idle(STEP / 2).unwrap(), (3, 0));
    assert_eq!(idle(&store), 6);
    assert_eq!(store.remark_idle(10 * STEP).unwrap(), (0, 6));
    assert_eq!(idle(&store), 0);
    let e = store.remark_idle(1 << 40).unwrap_err().to_string();
    assert!(e.contains("past what slots keep"), "{e}");
}

#[test]
fn the_secondary_algorithm_is_known_once_chosen() {
    let store = Store::new(config(Algo::Lz4, false)).unwrap();
    assert_eq!(store.secondary_algos(), vec![]);
    let p = Recompress {
        algos: vec![Algo::Zstd(9)],
        kind: RecompressType::All,
        threshold: 0,
        max_pages: 0,
        pages: Vec::new(),
    };
    store.recompress(&p).unwrap();
    assert_eq!(store.secondary_algos(), vec![Algo::Zstd(9)]);
    // A list set before any recompression names its entries in order;
    // one known keeps its place.
    store
        .set_secondaries(&[Algo::Lz4Hc(9), Algo::Zstd(9), Algo::Zstd(3)])
        .unwrap();
    assert_eq!(
        store.secondary_algos(),
        vec![Algo::Zstd(9), Algo::Lz4Hc(9), Algo::Zstd(3)]
    );
}

/// A list of two whose first never fits (`none` stores nothing smaller)
/// recompresses every page with the second, in either mode, and every
/// page reads back as written.
#[test]
fn a_list_falls_through_to_the_algorithm_that_fits() {
    let real = real_pages();
    let n = (real.len() / PAGE_SIZE) as u64;
    for packed in [false, true] {
        let mode = if packed { Mode::Packed } else { Mode::PerPage };
        let mut cfg = config_in(Algo::Lz4, false, mode);
        cfg.size = n * P;
        let store = Store::new(cfg).unwrap();
        let mut ctx = store.new_ctx();
        ctx.write(0, &real).unwrap();
        let only_first = Recompress {
            algos: vec![Algo::None],
            kind: RecompressType::All,
            threshold: 0,
            max_pages: 0,
            pages: Vec::new(),
        };
        let r = store.recompress(&only_first).unwrap();
        assert_eq!(r.recompressed, 0, "{r:?}");
        let both = Recompress {
            algos: vec![Algo::None, Algo::Zstd(9)],
            ..only_first
        };
        let r = store.recompress(&both).unwrap();
        assert!(r.recompressed * 2 > r.tried, "packed {packed}: {r:?}");
        assert_eq!(store.stats().recompress_algorithm, "none zstd:9");
        let mut back = vec![0u8; real.len()];
        ctx.read(0, &mut back).unwrap();
        assert!(back == real, "packed {packed}: pages differ");
    }
}

/// zram's priorities across passes: pages lz4hc holds are recompressed
/// again by a later secondary (zstd:19), never by lz4hc itself or an
/// earlier one; the memory drops again and every page reads back.
#[test]
fn a_later_secondary_recompresses_what_an_earlier_one_holds() {
    let real = real_pages();
    let n = (real.len() / PAGE_SIZE) as u64;
    let mut cfg = config(Algo::Lz4, false);
    cfg.size = n * P;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.new_ctx();
    ctx.write(0, &real).unwrap();
    let first = Recompress {
        algos: vec![Algo::Lz4Hc(9)],
        kind: RecompressType::All,
        threshold: 0,
        max_pages: 0,
        pages: Vec::new(),
    };
    let r1 = store.recompress(&first).unwrap();
    assert!(r1.recompressed > 0, "{r1:?}");
    let after1 = store.stats().counters;
    let second = Recompress {
        algos: vec![Algo::Zstd(19)],
        ..first.clone()
    };
    let r2 = store.recompress(&second).unwrap();
    let after2 = store.stats().counters;
    // zstd:19 tries every compressed page, lz4hc's too, and shrinks most.
    assert!(r2.tried >= r1.recompressed, "{r2:?} after {r1:?}");
    assert!(r2.recompressed > r1.recompressed / 2, "{r2:?} after {r1:?}");
    assert_eq!(
        after1.compr_data_size - after2.compr_data_size,
        r2.saved_bytes
    );
    // A page counts once however many times it moved.
    assert!(after2.recompressed_pages <= after2.stored_pages - after2.same_pages);
    assert_eq!(store.stats().recompress_algorithm, "lz4hc zstd:19");
    // lz4hc again: only what the primary still holds is tried.
    let r3 = store.recompress(&first).unwrap();
    assert!(
        r3.tried <= after2.stored_pages - after2.same_pages - after2.recompressed_pages,
        "{r3:?}"
    );
    let mut back = vec![0u8; real.len()];
    ctx.read(0, &mut back).unwrap();
    assert!(back == real, "pages differ");
}

/// A recompression of every page of `kind` with zstd:9.
fn zstd9(kind: RecompressType) -> Recompress {
    Recompress {
        algos: vec![Algo::Zstd(9)],
        kind,
        threshold: 0,
        max_pages: 0,
        pages: Vec::new(),
    }
}

/// A packed lz4 store of real pages recompressed with zstd:9 into packed
/// groups: most pages move, compr_data_size and mem_used_total drop,
/// every page reads back, a
/// second pass finds nothing left to gain, and a recovery reads the
/// secondary's groups back.
#[test]
fn packed_recompression_of_real_pages_saves_memory_and_survives_recovery() {
    // Eight copies, so that the slab's size classes fill zspages: a few
    // dozen objects alone would measure its rounding, not the codec.
    let real = real_pages().repeat(8);
    let n = (real.len() / PAGE_SIZE) as u64;
    let mut cfg = StoreConfig::new(n * P);
    cfg.algo = Algo::Lz4;
    cfg.mode = Mode::Packed;
    cfg.shared = true;
    let store = Store::new(cfg.clone()).unwrap();
    let mut ctx = store.new_ctx();
    ctx.write(0, &real).unwrap();
    let before = store.stats();
    let all = zstd9(RecompressType::All);
    let r = store.recompress(&all).unwrap();
    ctx.flush_frees();
    assert!(store.settle_frees(std::time::Duration::from_secs(5)));
    store.compact();
    let after = store.stats();
    let c = &after.counters;
    assert_eq!(
        r.tried,
        before.counters.stored_pages - before.counters.same_pages
    );
    // Groups that zstd:9 cannot shrink by 5 % more than packed lz4 did
    // stay as they were.
    assert!(r.recompressed * 2 >= r.tried, "{r:?}");
    assert_eq!(c.recompressed_pages, r.recompressed);
    assert_eq!(c.stored_pages, before.counters.stored_pages);
    assert_eq!(
        before.counters.compr_data_size - c.compr_data_size,
        r.saved_bytes
    );
    // lz4 -> zstd:9 gives back at least 5 % of a packed store of real
    // memory (11 % on these 96 pages; BENCHMARKS.md has the corpus).
    assert!(
        c.compr_data_size * 100 < before.counters.compr_data_size * 95,
        "{} -> {}",
        before.counters.compr_data_size,
        c.compr_data_size
    );
    assert!(
        after.mem_used_total < before.mem_used_total,
        "{} -> {}",
        before.mem_used_total,
        after.mem_used_total
    );
    let mut back = vec![0u8; real.len()];
    ctx.read(0, &mut back).unwrap();
    assert!(back == real);
    let again = store.recompress(&all).unwrap();
    assert_eq!(again.recompressed, 0, "{again:?}");

    let store = crash_and_recover(store, ctx, cfg);
    let st = store.stats();
    assert_eq!(st.recovery_dropped, 0);
    assert_eq!(st.counters.recompressed_pages, r.recompressed);
    assert_eq!(st.counters.compr_data_size, c.compr_data_size);
    let mut ctx = store.new_ctx();
    let mut back = vec![0u8; real.len()];
    ctx.read(0, &mut back).unwrap();
    assert!(back == real);
}

/// A packed group is recompressed only whole: with half of each group's
/// pages idle, an idle recompression leaves every group as it is (moving
/// half would free none of the old object and add a new one); once the
/// whole group is idle it moves, and memory drops.
#[test]
fn packed_recompression_moves_whole_groups_only() {
    let real = real_pages();
    let pages = (real.len() / PAGE_SIZE) as u64 / 8 * 8;
    let mut cfg = StoreConfig::new(pages * P);
    cfg.algo = Algo::Lz4;
    cfg.mode = Mode::Packed;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.new_ctx();
    ctx.write(0, &real[..(pages * P) as usize]).unwrap();
    store.mark_idle(None).unwrap();
    // The first half of every group is read again: young.
    let mut buf = vec![0u8; 4 * PAGE_SIZE];
    for g in 0..pages / 8 {
        ctx.read(g * 8 * P, &mut buf).unwrap();
    }
    let before = store.stats();
    let idle = zstd9(RecompressType::Idle);
    let r = store.recompress(&idle).unwrap();
    // Only pages the store kept per page (these pages are noise there: a
    // group of them did not pack) are whole on their own, and tried.
    assert!(r.tried < pages / 4, "{r:?}");
    assert_eq!(r.recompressed, 0, "{r:?}");
    assert_eq!(
        store.stats().counters.compr_data_size,
        before.counters.compr_data_size
    );
    store.mark_idle(None).unwrap();
    let r = store.recompress(&idle).unwrap();
    assert!(r.recompressed * 2 >= pages, "{r:?}");
    let after = store.stats();
    assert!(after.counters.compr_data_size < before.counters.compr_data_size);
    let mut back = vec![0u8; (pages * P) as usize];
    ctx.read(0, &mut back).unwrap();
    assert!(back[..] == real[..back.len()]);
}

/// A recompression within page ranges (`zblk recompress --cgroup`) looks
/// at their pages only: in a per-page and in a packed store of real
/// pages, every page a secondary holds afterwards is in the ranges, the
/// per-page store's ranges are recompressed, every page reads back, and a
/// range past the device's end is refused before anything moves.
#[test]
fn recompression_within_page_ranges_touches_only_their_pages() {
    let real = real_pages();
    let n = (real.len() / PAGE_SIZE) as u64;
    let ranges = ["10-19", "40", "60-62"];
    let inside = |i: u64| (10..=19).contains(&i) || i == 40 || (60..=62).contains(&i);
    for mode in [Mode::PerPage, Mode::Packed] {
        let mut cfg = StoreConfig::new(n * P);
        cfg.algo = Algo::Lz4;
        cfg.mode = mode;
        let store = Store::new(cfg).unwrap();
        let mut ctx = store.new_ctx();
        ctx.write(0, &real).unwrap();
        let p = Recompress {
            pages: ranges.iter().map(|r| r.parse().unwrap()).collect(),
            ..zstd9(RecompressType::All)
        };
        let past = Recompress {
            pages: vec![format!("5-{n}").parse().unwrap()],
            ..zstd9(RecompressType::All)
        };
        let e = store.recompress(&past).unwrap_err().to_string();
        assert!(e.contains("past the device's end"), "{e}");
        let r = store.recompress(&p).unwrap();
        assert!(r.tried <= 14, "{mode:?}: {r:?}");
        let moved: Vec<u64> = store
            .slot_states(0..n)
            .iter()
            .filter(|s| s.algo.as_deref() == Some("zstd:9"))
            .map(|s| s.index)
            .collect();
        assert_eq!(moved.len() as u64, r.recompressed, "{mode:?}: {moved:?}");
        assert!(moved.iter().all(|&i| inside(i)), "{mode:?}: {moved:?}");
        if mode == Mode::PerPage {
            assert!(r.tried > 0 && r.recompressed > 0, "{r:?}");
        }
        let mut back = vec![0u8; real.len()];
        ctx.read(0, &mut back).unwrap();
        assert!(back == real, "{mode:?}: pages differ");
    }
}
