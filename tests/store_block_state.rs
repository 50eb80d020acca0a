//! `Store::slot_states` (zram's `block_state`) against pages of known
//! kinds, per page and packed, and writeback by page index (zram's
//! `page_indexes=`): exactly the stored pages of the ranges go to the
//! backing file, the dump says so, and they read back as written.

mod common;

use common::{page, Content};
use std::path::PathBuf;
use zblk::{
    Algo, Mode, PageRange, Recompress, RecompressType, SlotKind, SlotState, Store, StoreConfig,
    Writeback, WritebackSelect, PAGE_SIZE,
};

const P: u64 = PAGE_SIZE as u64;

/// Page `i` of the test device: 0 zeros, 1 a repeated word, 2 random
/// (huge), then text (compressed).
fn content(i: u64) -> Content {
    match i {
        0 => Content::Zeros,
        1 => Content::SameWord(0x5a5a_0000_1111_2222),
        2 => Content::Random(9),
        i => Content::Text(i),
    }
}

/// `n` pages of [`content`].
fn pages(n: u64) -> Vec<u8> {
    (0..n).flat_map(|i| page(content(i), &[])).collect()
}

/// A backing file of `blocks` blocks in a fresh temporary directory.
fn backing_file(blocks: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("backing");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(blocks * P).unwrap();
    (dir, path)
}

fn kinds(states: &[SlotState]) -> Vec<(u64, SlotKind)> {
    states.iter().map(|s| (s.index, s.kind)).collect()
}

#[test]
fn each_stored_page_shows_its_kind_size_and_algorithm() {
    let store = Store::new(StoreConfig::new(16 * P)).unwrap();
    let mut ctx = store.new_ctx();
    ctx.write(0, &pages(12)).unwrap();
    store.debug_advance_clock(5);
    let mut one = vec![0u8; PAGE_SIZE];
    ctx.read(3 * P, &mut one).unwrap();
    store.mark_idle(Some(5)).unwrap();
    let all = store.slot_states(0..16);
    assert_eq!(all.len(), 12, "empty slots are left out");
    let at = |i: usize| &all[i];
    assert_eq!(
        (at(0).kind, at(0).size, &at(0).algo),
        (SlotKind::Same, 0, &None)
    );
    assert_eq!(at(1).kind, SlotKind::Same);
    assert_eq!(
        (at(2).kind, at(2).size, &at(2).algo),
        (SlotKind::Huge, 4096, &None)
    );
    for s in &all[3..] {
        assert_eq!(s.kind, SlotKind::Compressed, "{s:?}");
        assert!(s.size > 0 && s.size < 4096, "{s:?}");
        assert_eq!(s.algo.as_deref(), Some("lz4"));
    }
    let compr: u64 = all.iter().map(|s| u64::from(s.size)).sum();
    assert_eq!(compr, store.stats().counters.compr_data_size);
    // Page 3 was read after the clock moved: younger, and not idle.
    assert_eq!((at(3).atime, at(3).idle), (at(4).atime + 5, false));
    assert!(all.iter().filter(|s| s.index != 3).all(|s| s.idle));
    // A range is a window: clipped to the device, in page order.
    assert_eq!(kinds(&store.slot_states(10..100)), kinds(&all[10..]));
    assert!(store.slot_states(16..20).is_empty());
    let json = serde_json::to_string(at(2)).unwrap();
    assert_eq!(
        json,
        format!(
            r#"{{"index":2,"kind":"huge","size":4096,"algo":null,"idle":true,"incompressible":false,"atime":{}}}"#,
            at(2).atime
        )
    );
}

#[test]
fn pages_asked_by_index_come_back_in_the_order_asked() {
    let store = Store::new(StoreConfig::new(16 * P)).unwrap();
    store.new_ctx().write(0, &pages(12)).unwrap();
    let all = store.slot_states(0..16);
    // 14 is empty, 16 and u64::MAX are past the end: all left out; a page
    // asked twice comes back twice.
    let asked = [7, 2, 14, 0, 16, 7, u64::MAX, 11];
    let got = store.slot_states_at(&asked);
    let want: Vec<SlotState> = [7, 2, 0, 7, 11]
        .iter()
        .map(|&i| all[i as usize].clone())
        .collect();
    assert_eq!(got, want);
    assert!(store.slot_states_at(&[]).is_empty());
}

#[test]
fn recompressed_pages_name_the_secondary() {
    let store = Store::new(StoreConfig::new(16 * P)).unwrap();
    store.new_ctx().write(0, &pages(12)).unwrap();
    let r = store
        .recompress(&Recompress {
            algos: vec![Algo::Zstd(9)],
            kind: RecompressType::All,
            threshold: 0,
            max_pages: 0,
            pages: Vec::new(),
        })
        .unwrap();
    assert!(r.recompressed > 0, "{r:?}");
    let states = store.slot_states(0..16);
    let by_secondary = states
        .iter()
        .filter(|s| s.algo.as_deref() == Some("zstd:9"))
        .count() as u64;
    assert_eq!(by_secondary, r.recompressed);
    assert!(states[2].incompressible, "the random page is tried in vain");
}

#[test]
fn packed_pages_show_their_share_of_the_group() {
    let mut cfg = StoreConfig::new(16 * P);
    cfg.mode = Mode::Packed;
    let store = Store::new(cfg).unwrap();
    store.new_ctx().write(0, &pages(16)).unwrap();
    let states = store.slot_states(0..16);
    assert_eq!(states.len(), 16);
    let packed: Vec<_> = states
        .iter()
        .filter(|s| s.kind == SlotKind::Packed)
        .collect();
    assert!(packed.len() >= 10, "{states:?}");
    for s in &packed {
        assert!(
            s.size > 0 && s.size < 4096 && s.algo.as_deref() == Some("lz4"),
            "{s:?}"
        );
    }
    assert_eq!(states[0].kind, SlotKind::Same);
}

#[test]
fn writeback_by_page_index_moves_exactly_the_stored_pages_of_its_ranges() {
    let (_dir, bd) = backing_file(64);
    let mut cfg = StoreConfig::new(32 * P);
    cfg.backing = Some(bd);
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.new_ctx();
    let data = pages(24);
    ctx.write(0, &data).unwrap();
    let range = |first, last| PageRange { first, last };
    let select = |rs: Vec<PageRange>, limit| Writeback {
        select: WritebackSelect::Pages(rs),
        limit,
    };
    // Pages 0-1 are same-filled and stay; 2 (huge) to 6, 10 and 20-23
    // go; 24-31 are empty. Overlaps count once.
    let r = store
        .writeback(&select(
            vec![range(0, 6), range(4, 5), range(10, 10), range(20, 31)],
            0,
        ))
        .unwrap();
    let want: Vec<u64> = [2, 3, 4, 5, 6, 10, 20, 21, 22, 23].into();
    assert_eq!((r.selected, r.written, r.raced), (10, 10, 0), "{r:?}");
    let backed: Vec<u64> = store
        .slot_states(0..32)
        .iter()
        .filter(|s| s.kind == SlotKind::WrittenBack)
        .map(|s| s.index)
        .collect();
    assert_eq!(backed, want);
    assert_eq!(store.stats().counters.bd_count, 10);
    let mut back = vec![0u8; data.len()];
    ctx.read(0, &mut back).unwrap();
    assert!(back == data, "written-back pages read back as written");

    // The device's writeback limit applies to ranges as to types.
    store.set_writeback_limit(2);
    let r = store.writeback(&select(vec![range(7, 19)], 0)).unwrap();
    assert_eq!((r.written, r.limited), (2, true));
    store.set_writeback_limit(0);
    let r = store.writeback(&select(vec![range(7, 19)], 3)).unwrap();
    assert_eq!(r.written, 3, "and so does the request's own limit");

    let e = store
        .writeback(&select(vec![range(30, 32)], 0))
        .unwrap_err();
    assert_eq!(e.to_string().lines().count(), 1, "one line: {e}");
    assert!(
        e.to_string()
            .contains("page range 30-32 is past the device's end"),
        "{e}"
    );
}
