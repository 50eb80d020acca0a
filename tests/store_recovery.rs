//! Recovery of a store from its shared memory after its process "died"
//! (`debug_crash`: the drain stops, everything is leaked, nothing freed):
//! every page reads back as the model says, the gauges are recounted
//! exactly, and nothing leaks (memory back to zero once all is discarded).

mod common;

use common::{crash, page, real_pages, Content, Rng};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use zblk::{Algo, Mode, QueueCtx, RecompressType, Store, StoreConfig, PAGE_SIZE};

const P: u64 = PAGE_SIZE as u64;
const PAGES: u64 = 512;

fn config(mode: Mode) -> StoreConfig {
    let mut cfg = StoreConfig::new(PAGES * P);
    cfg.shared = true;
    cfg.mode = mode;
    cfg
}

/// The model of a new store: every page reads as zeros.
fn zeros() -> Vec<Vec<u8>> {
    vec![vec![0u8; PAGE_SIZE]; PAGES as usize]
}

/// Writes a mix of real, same-filled, incompressible and text pages in
/// requests of 1 to 16 pages, overwrites and discards some, keeping
/// `model` (the content every page must read as) up to date.
fn churn(ctx: &mut QueueCtx, seed: u64, model: &mut [Vec<u8>]) {
    let real = real_pages();
    let real_n = real.len() / PAGE_SIZE;
    let mut rng = Rng(seed);
    for round in 0..400 {
        let n = 1 + rng.below(16);
        let first = rng.below(PAGES - n + 1);
        if round % 7 == 6 {
            ctx.discard(first * P, n * P).unwrap();
            for p in first..first + n {
                model[p as usize].fill(0);
            }
            continue;
        }
        let mut data = Vec::with_capacity((n * P) as usize);
        for _ in 0..n {
            let pg = match rng.below(4) {
                0 => {
                    let i = rng.below(real_n as u64) as usize;
                    real[i * PAGE_SIZE..(i + 1) * PAGE_SIZE].to_vec()
                }
                1 => page(Content::SameWord(rng.next()), &[]),
                2 => page(Content::Random(rng.next()), &[]),
                _ => page(Content::Text(rng.next()), &[]),
            };
            data.extend_from_slice(&pg);
        }
        ctx.write(first * P, &data).unwrap();
        for (i, pg) in data.chunks(PAGE_SIZE).enumerate() {
            model[first as usize + i] = pg.to_vec();
        }
    }
}

/// Recompresses the pages of `kind` with `algos` (at most `max_pages`,
/// 0: any), which must store some of them.
fn recompress(store: &Store, algos: Vec<Algo>, kind: RecompressType, max_pages: u64) {
    let r = store
        .recompress(&zblk::Recompress {
            algos,
            kind,
            threshold: 0,
            max_pages,
            pages: Vec::new(),
        })
        .unwrap();
    assert!(r.recompressed > 0, "{r:?}");
}

fn verify(ctx: &mut QueueCtx, model: &[Vec<u8>]) {
    let mut buf = vec![0u8; PAGE_SIZE];
    for (p, want) in model.iter().enumerate() {
        ctx.read(p as u64 * P, &mut buf).unwrap();
        assert!(
            &buf == want,
            "page {p} differs after recovery: got {:?}.. want {:?}..",
            &buf[..16],
            &want[..16]
        );
    }
}

fn recovers_everything(mode: Mode) {
    let store = Store::new(config(mode)).unwrap();
    let mut ctx = store.new_ctx();
    let mut model = zeros();
    churn(&mut ctx, 7, &mut model);
    store.compact();
    verify(&mut ctx, &model);
    let before = store.stats();
    let fd = crash(store, ctx);

    let store = Store::recover(config(mode), fd).unwrap();
    let st = store.stats();
    assert_eq!(st.recoveries, 1);
    assert!(st.recovered_at > 0);
    assert_eq!(st.recovery_dropped, 0);
    let c = &st.counters;
    let b = &before.counters;
    assert_eq!(c.stored_pages, b.stored_pages, "stored_pages recounted");
    assert_eq!(c.same_pages, b.same_pages, "same_pages recounted");
    assert_eq!(c.huge_pages, b.huge_pages, "huge_pages recounted");
    assert_eq!(
        c.compr_data_size, b.compr_data_size,
        "compr_data_size recounted"
    );
    assert_eq!(c.orig_data_size, b.orig_data_size);
    assert_eq!(
        c.packed_dead_bytes, b.packed_dead_bytes,
        "dead bytes recounted"
    );
    assert_eq!(c.num_writes, 0, "event counters restart");
    let stored = model.iter().filter(|p| p.iter().any(|&b| b != 0)).count() as u64;
    assert!(c.stored_pages >= stored, "every non-zero page is stored");
    assert!(st.mem_used_total > 0);
    assert!(
        st.mem_used_total <= before.mem_used_total,
        "pending frees and spares were reclaimed: {} > {}",
        st.mem_used_total,
        before.mem_used_total
    );

    let mut ctx = store.new_ctx();
    verify(&mut ctx, &model);
    // Compaction moves objects by the owners the scan found.
    store.compact();
    verify(&mut ctx, &model);
    // The recovered store keeps working: more churn, then verify again.
    churn(&mut ctx, 99, &mut model);
    verify(&mut ctx, &model);
    ctx.discard(0, PAGES * P).unwrap();
    drop(ctx);
    let st = store.stats();
    assert_eq!(st.counters.stored_pages, 0);
    assert_eq!(st.mem_used_total, 0, "nothing leaked across the recovery");
}

#[test]
fn per_page_store_recovers_every_page_and_its_gauges() {
    recovers_everything(Mode::PerPage);
}

#[test]
fn packed_store_recovers_every_page_and_its_gauges() {
    recovers_everything(Mode::Packed);
}

#[test]
fn an_lz4hc_store_recovers_every_page_and_only_as_lz4hc() {
    let lz4hc = |level| {
        let mut cfg = config(Mode::Packed);
        cfg.algo = Algo::Lz4Hc(level);
        cfg
    };
    let store = Store::new(lz4hc(12)).unwrap();
    let mut ctx = store.new_ctx();
    let mut model = zeros();
    churn(&mut ctx, 11, &mut model);
    let fd = crash(store, ctx);
    let copy = fd.try_clone().unwrap();
    let e = Store::recover(lz4hc(9), copy)
        .err()
        .expect("another level is refused");
    assert!(e.to_string().contains("lz4hc:12"), "{e}");
    let store = Store::recover(lz4hc(12), fd).unwrap();
    assert_eq!(store.stats().recovery_dropped, 0);
    verify(&mut store.new_ctx(), &model);
}

#[test]
fn a_store_recovers_again_and_again() {
    let mut store = Store::new(config(Mode::Packed)).unwrap();
    let mut ctx = store.new_ctx();
    let mut model = zeros();
    churn(&mut ctx, 1, &mut model);
    for round in 1..=3u64 {
        let fd = crash(store, ctx);
        store = Store::recover(config(Mode::Packed), fd).unwrap();
        assert_eq!(store.stats().recoveries, round);
        ctx = store.new_ctx();
        verify(&mut ctx, &model);
        // Reading fills the packed read cache with pre-crash object ids;
        // writing makes new objects, whose ids must not collide with them.
        churn(&mut ctx, round * 31, &mut model);
        verify(&mut ctx, &model);
    }
}

#[test]
fn recovery_refuses_memory_of_another_store() {
    let store = Store::new(config(Mode::PerPage)).unwrap();
    let ctx = store.new_ctx();
    let fd = crash(store, ctx);
    let mut other = config(Mode::PerPage);
    other.size = 2 * PAGES * P;
    let e = Store::recover(other, fd)
        .err()
        .expect("another size is refused");
    assert!(e.to_string().contains("size"), "{e}");

    let file = tempfile::tempfile().unwrap();
    let e = Store::recover(config(Mode::PerPage), file.into())
        .err()
        .expect("a plain file is no store");
    assert!(e.to_string().contains("shared memory"), "{e}");

    let mut private = config(Mode::PerPage);
    private.shared = false;
    let fd: OwnedFd = tempfile::tempfile().unwrap().into();
    assert!(
        Store::recover(private, fd).is_err(),
        "only shared stores recover"
    );
}

#[test]
fn a_private_store_has_no_memory_fd() {
    let store = Store::new(StoreConfig::new(PAGES * P)).unwrap();
    assert!(store.memory_fd().is_none());
    assert!(!store.stats().shared);
}

/// Idle marks, access times and recompressed pages live in the slots and
/// the header: a recovered store has the same idle and recompressed pages,
/// reads every recompressed page back with the secondary algorithm, and
/// ages pages from the times they had.
#[test]
fn idle_marks_access_times_and_recompressed_pages_survive_a_recovery() {
    let store = Store::new(config(Mode::PerPage)).unwrap();
    let mut ctx = store.new_ctx();
    let mut model = zeros();
    churn(&mut ctx, 5, &mut model);
    store.debug_advance_clock(1000);
    // The second half is read at 1000 s: young; the first half is old.
    let half = PAGES / 2;
    let mut buf = vec![0u8; (half * P) as usize];
    ctx.read(half * P, &mut buf).unwrap();
    let marked = store.mark_idle(Some(500)).unwrap();
    recompress(&store, vec![Algo::Deflate(9)], RecompressType::Idle, 0);
    let before = store.stats();
    assert_eq!(before.counters.idle_pages, marked);
    assert!(before.counters.recompressed_pages > 0);
    let fd = crash(store, ctx);

    let store = Store::recover(config(Mode::PerPage), fd).unwrap();
    let st = store.stats();
    assert_eq!(st.recovery_dropped, 0);
    assert_eq!(st.recompress_algorithm, "deflate:9");
    let (c, b) = (&st.counters, &before.counters);
    assert_eq!(c.idle_pages, b.idle_pages, "idle marks survive");
    assert_eq!(c.recompressed_pages, b.recompressed_pages);
    assert_eq!(c.compr_data_size, b.compr_data_size);
    // The recovered store's clock counts from the same base; the test's
    // 1000 s were added by hand, so add them again.
    store.debug_advance_clock(1000);
    assert_eq!(
        store.mark_idle(Some(500)).unwrap(),
        0,
        "the young half kept its access time"
    );
    // The secondary keeps its place: another one comes after it.
    recompress(&store, vec![Algo::Zstd(9)], RecompressType::All, 0);
    assert_eq!(store.stats().recompress_algorithm, "deflate:9 zstd:9");
    let mut ctx = store.new_ctx();
    verify(&mut ctx, &model);
    assert_eq!(store.stats().counters.idle_pages, 0, "reads cleared them");
    ctx.discard(0, PAGES * P).unwrap();
    drop(ctx);
    let st = store.stats();
    assert_eq!(st.counters.recompressed_pages, 0);
    assert_eq!(st.mem_used_total, 0, "nothing leaked");
}

/// Pages held by the second and the first of two secondary algorithms
/// read back after a recovery, which finds the list in the header.
#[test]
fn a_list_of_secondary_algorithms_survives_a_recovery() {
    let store = Store::new(config(Mode::PerPage)).unwrap();
    let mut ctx = store.new_ctx();
    let mut model = zeros();
    churn(&mut ctx, 13, &mut model);
    // `none` never fits: the first pages go to entry 2, the rest to 3.
    let all = RecompressType::All;
    recompress(&store, vec![Algo::None, Algo::Zstd(9)], all, 100);
    recompress(&store, vec![Algo::Deflate(9)], all, 0);
    let before = store.stats();
    assert_eq!(before.recompress_algorithm, "none zstd:9 deflate:9");
    let fd = crash(store, ctx);

    let store = Store::recover(config(Mode::PerPage), fd).unwrap();
    let st = store.stats();
    assert_eq!(st.recovery_dropped, 0);
    assert_eq!(st.recompress_algorithm, "none zstd:9 deflate:9");
    assert_eq!(
        st.counters.recompressed_pages,
        before.counters.recompressed_pages
    );
    verify(&mut store.new_ctx(), &model);
}

/// A store written by layout 4 (one secondary algorithm, in the header's
/// old place) is taken over, its recompressed pages read by that one.
#[test]
fn a_layout_4_store_keeps_its_secondary_algorithm() {
    let store = Store::new(config(Mode::Packed)).unwrap();
    let mut ctx = store.new_ctx();
    let mut model = zeros();
    churn(&mut ctx, 17, &mut model);
    recompress(&store, vec![Algo::Zstd(9)], RecompressType::All, 0);
    // SAFETY: nothing else uses the store.
    unsafe { zblk::debug_as_layout4(&store) }.expect("shared");
    let fd = crash(store, ctx);
    let store = Store::recover(config(Mode::Packed), fd).unwrap();
    let st = store.stats();
    assert_eq!(
        (st.recovery_dropped, st.recompress_algorithm.as_str()),
        (0, "zstd:9")
    );
    verify(&mut store.new_ctx(), &model);
}

/// Limits set at run time and the owner's note outlive the process: a
/// recovered store keeps them over its configuration's, a store that was
/// never changed takes its configuration's.
#[test]
fn run_time_limits_and_the_owner_note_survive_a_recovery() {
    let mut cfg = StoreConfig::new(64 * PAGE_SIZE as u64);
    cfg.shared = true;
    cfg.mem_limit = 1 << 30;
    let store = Store::new(cfg.clone()).unwrap();
    let fd = store.memory_fd().unwrap().try_clone_to_owned().unwrap();
    assert_eq!(store.owner_note(), None);
    zblk::debug_crash(store);
    let store = Store::recover(cfg.clone(), fd).unwrap();
    assert_eq!(store.stats().mem_limit, 1 << 30, "nothing set: cfg's");

    store.set_mem_limit(8 << 20);
    store.set_writeback_limit(77);
    store
        .set_owner_note(r#"{"recompress_idle_after":60}"#)
        .unwrap();
    let e = store.set_owner_note(&"x".repeat(5000)).unwrap_err();
    assert!(e.to_string().contains("2048"), "{e}");
    let fd = store.memory_fd().unwrap().try_clone_to_owned().unwrap();
    zblk::debug_crash(store);
    let store = Store::recover(cfg.clone(), fd).unwrap();
    let st = store.stats();
    assert_eq!(st.mem_limit, 8 << 20);
    assert!(st.writeback_limit_enable);
    assert_eq!(st.writeback_limit, 77);
    assert_eq!(
        store.owner_note().as_deref(),
        Some(r#"{"recompress_idle_after":60}"#)
    );
    // A later limit keeps the note; turning limits off is kept too.
    store.set_mem_limit(0);
    store.set_writeback_limit(0);
    let fd = store.memory_fd().unwrap().try_clone_to_owned().unwrap();
    zblk::debug_crash(store);
    let store = Store::recover(cfg, fd).unwrap();
    let st = store.stats();
    assert_eq!(st.mem_limit, 0);
    assert!(!st.writeback_limit_enable);
    assert!(store.owner_note().is_some());
}

/// A store left by a zblk of layout 3, whose packed headers had no seal:
/// a recovery takes it over whole and seals them (a current store refuses
/// an unsealed header, so without that every packed page would be lost),
/// and the next recovery, of the layout it was rewritten as, finds them
/// sealed.
#[test]
fn a_layout_3_store_is_taken_over_and_its_packed_headers_sealed() {
    let store = Store::new(config(Mode::Packed)).unwrap();
    let mut ctx = store.new_ctx();
    let mut model = zeros();
    churn(&mut ctx, 5, &mut model);
    verify(&mut ctx, &model);
    // SAFETY: nothing else uses the store.
    let packed = unsafe { zblk::debug_as_layout3(&store) }.expect("a shared store");
    assert!(packed > 0, "the churn stores packed groups");
    // The running store checks seals: an unsealed header is refused.
    let page = (0..PAGES)
        .find(|&p| {
            let mut buf = vec![0u8; PAGE_SIZE];
            ctx.read(p * P, &mut buf).is_err()
        })
        .expect("an unsealed packed page fails its read");
    assert_ne!(model[page as usize], vec![0u8; PAGE_SIZE]);
    let fd = crash(store, ctx);

    let store = Store::recover(config(Mode::Packed), fd).unwrap();
    assert_eq!(store.stats().recovery_dropped, 0, "no page dropped");
    let mut ctx = store.new_ctx();
    verify(&mut ctx, &model);
    let fd = crash(store, ctx);
    let store = Store::recover(config(Mode::Packed), fd).unwrap();
    assert_eq!(store.stats().recovery_dropped, 0, "sealed: still trusted");
    let mut ctx = store.new_ctx();
    verify(&mut ctx, &model);
    churn(&mut ctx, 6, &mut model);
    verify(&mut ctx, &model);
}

/// The store's dictionaries: part of the real pages for the primary
/// (lz4) and a secondary (zstd:9).
fn with_dictionaries(mut cfg: StoreConfig) -> StoreConfig {
    let real = real_pages();
    let dict = |from: usize| Arc::<[u8]>::from(&real[from * PAGE_SIZE..(from + 8) * PAGE_SIZE]);
    cfg.dictionaries.set(Algo::Lz4, dict(0)).unwrap();
    cfg.dictionaries.set(Algo::Zstd(9), dict(8)).unwrap();
    cfg
}

/// A store made with dictionaries is recovered by a process that has none
/// configured: its pages, those recompressed with the secondary's
/// dictionary included, read back from the dictionaries the store
/// recorded, and a second recovery finds them again.
#[test]
fn a_store_with_dictionaries_is_recovered_without_the_files() {
    for mode in [Mode::PerPage, Mode::Packed] {
        let store = Store::new(with_dictionaries(config(mode))).unwrap();
        let mut ctx = store.new_ctx();
        let mut model = zeros();
        churn(&mut ctx, 23, &mut model);
        recompress(&store, vec![Algo::Zstd(9)], RecompressType::All, 64);
        verify(&mut ctx, &model);
        let fd = crash(store, ctx);
        let store = Store::recover(config(mode), fd).unwrap();
        assert_eq!(
            store.config().dictionaries,
            with_dictionaries(config(mode)).dictionaries,
            "{mode}"
        );
        assert_eq!(store.stats().recovery_dropped, 0);
        let mut ctx = store.new_ctx();
        verify(&mut ctx, &model);
        churn(&mut ctx, 24, &mut model);
        let fd = crash(store, ctx);
        let store = Store::recover(config(mode), fd).unwrap();
        verify(&mut store.new_ctx(), &model);
    }
}

/// A store left by layout 5 (a file that ends after the classes' regions)
/// is grown to the current layout and taken over, without dictionaries.
#[test]
fn a_layout_5_store_is_taken_over_without_dictionaries() {
    let store = Store::new(config(Mode::PerPage)).unwrap();
    let mut ctx = store.new_ctx();
    let mut model = zeros();
    churn(&mut ctx, 29, &mut model);
    // SAFETY: nothing else uses the store.
    unsafe { zblk::debug_as_layout5(&store) }.expect("shared, no dictionaries");
    let fd = crash(store, ctx);
    let store = Store::recover(with_dictionaries(config(Mode::PerPage)), fd).unwrap();
    assert!(
        store.config().dictionaries.is_empty(),
        "none recorded, none used"
    );
    let mut ctx = store.new_ctx();
    verify(&mut ctx, &model);
    churn(&mut ctx, 30, &mut model);
    let fd = crash(store, ctx);
    let store = Store::recover(config(Mode::PerPage), fd).unwrap();
    verify(&mut store.new_ctx(), &model);
}

/// A sample is whole stored pages from across the device (no empty or
/// same-filled one), as many as asked for while there are enough, and
/// reading them is not an access.
#[test]
fn a_sample_is_stored_pages_from_across_the_device() {
    let store = Store::new(config(Mode::PerPage)).unwrap();
    let mut ctx = store.new_ctx();
    let mut model = zeros();
    churn(&mut ctx, 31, &mut model);
    store.mark_idle(None).unwrap();
    let idle = store.stats().counters.idle_pages;
    let s = store.sample(16 * PAGE_SIZE);
    assert_eq!(s.len(), 16 * PAGE_SIZE);
    let content: Vec<&Vec<u8>> = model
        .iter()
        .filter(|p| p.windows(8).any(|w| w != &p[..8]))
        .collect();
    for got in s.chunks(PAGE_SIZE) {
        assert!(
            content.iter().any(|p| p[..] == *got),
            "a page the device does not hold"
        );
    }
    assert_eq!(
        store.stats().counters.idle_pages,
        idle,
        "sampling touched pages"
    );
    assert!(Store::new(config(Mode::PerPage))
        .unwrap()
        .sample(PAGE_SIZE)
        .is_empty());
}

#[test]
fn a_store_in_2mb_pages_recovers_and_gives_back_every_page() {
    // Raw (incompressible) pages all go to one size class, whose chunks
    // pass 4 MB after about a thousand zspages: the later ones are mapped
    // for 2 MB pages where this machine gives them.
    const N: u64 = 3000;
    let cfg = || {
        let mut cfg = StoreConfig::new(N * P);
        cfg.shared = true;
        cfg.huge_pages = true;
        cfg
    };
    let store = Store::new(cfg()).unwrap();
    let mut ctx = store.new_ctx();
    let mut model = Vec::with_capacity(N as usize);
    for p in 0..N {
        let pg = page(Content::Random(p + 1), &[]);
        ctx.write(p * P, &pg).unwrap();
        model.push(pg);
    }
    eprintln!(
        "{} bytes of shared memory in 2 MB pages",
        zblk::huge_mapped_bytes()
    );
    let fd = crash(store, ctx);
    let store = Store::recover(cfg(), fd).unwrap();
    let mut ctx = store.new_ctx();
    let mut buf = vec![0u8; PAGE_SIZE];
    // Every other page discarded: zspages given back inside 2 MB pages.
    for p in (0..N).step_by(2) {
        ctx.discard(p * P, P).unwrap();
        model[p as usize].fill(0);
    }
    store.compact();
    for p in 0..N {
        ctx.read(p * P, &mut buf).unwrap();
        assert!(buf == model[p as usize], "page {p}");
    }
    ctx.discard(0, N * P).unwrap();
    drop(ctx);
    let st = store.stats();
    assert_eq!(st.counters.stored_pages, 0);
    assert_eq!(st.mem_used_total, 0, "nothing leaked");
}
