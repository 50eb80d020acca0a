//! Packed mode: ratio, dead pages, and the compactor's rewrite of sparse
//! groups.

mod common;

use common::real_pages;
use zblk::{Algo, Mode, Store, StoreConfig, PAGE_SIZE};

const P: u64 = PAGE_SIZE as u64;

fn store(mode: Mode, pages: usize) -> std::sync::Arc<Store> {
    let mut cfg = StoreConfig::new(pages as u64 * P);
    cfg.algo = Algo::Zstd(1);
    cfg.mode = mode;
    Store::new(cfg).unwrap()
}

#[test]
fn packed_compresses_real_memory_better_than_per_page() {
    let real = real_pages();
    let pages = real.len() / PAGE_SIZE;
    let mut ratio = Vec::new();
    for mode in [Mode::PerPage, Mode::Packed] {
        let s = store(mode, pages);
        let mut ctx = s.new_ctx();
        ctx.write(0, &real).unwrap();
        let mut back = vec![0u8; real.len()];
        ctx.read(0, &mut back).unwrap();
        assert!(back == real, "{mode} round trip");
        let st = s.stats();
        ratio.push(st.counters.orig_data_size as f64 / st.counters.compr_data_size as f64);
    }
    assert!(
        ratio[1] > ratio[0],
        "packed {} vs per-page {}",
        ratio[1],
        ratio[0]
    );
}

#[test]
fn discarded_pages_are_dead_bytes_until_the_group_is_rewritten() {
    let real = real_pages();
    let s = store(Mode::Packed, 64);
    let mut ctx = s.new_ctx();
    // Pages 64..72 of the fixture: a group of compressible real memory.
    let group = &real[64 * PAGE_SIZE..72 * PAGE_SIZE];
    ctx.write(0, group).unwrap();
    let full = s.stats();
    assert_eq!(full.counters.huge_pages, 0, "the group packed");
    assert_eq!(full.counters.packed_dead_bytes, 0);
    // Discard 6 of the 8 pages: the object stays for the 2 live ones.
    ctx.discard(0, 6 * P).unwrap();
    let st = s.stats();
    assert!(st.counters.packed_dead_bytes > 0);
    assert_eq!(
        st.counters.packed_dead_bytes + st.counters.compr_data_size,
        full.counters.compr_data_size,
        "every byte is either live or dead"
    );
    let held = st.mem_used_total;
    assert_eq!(held, full.mem_used_total, "discard alone frees nothing");
    // The compactor moves the two live pages out; the object is freed.
    s.compact();
    drop(ctx);
    let st = s.stats();
    assert_eq!(st.counters.packed_dead_bytes, 0);
    assert_eq!(st.counters.packed_pages_rewritten, 2);
    assert!(st.mem_used_total < held, "{} < {held}", st.mem_used_total);
    let mut ctx = s.new_ctx();
    let mut back = vec![0u8; 2 * PAGE_SIZE];
    ctx.read(6 * P, &mut back).unwrap();
    assert!(back == group[6 * PAGE_SIZE..], "rewritten pages read back");
    ctx.discard(0, 64 * P).unwrap();
    drop(ctx);
    assert_eq!(s.stats().mem_used_total, 0);
}

#[test]
fn corrupt_packed_object_fails_every_page_of_the_group() {
    let real = real_pages();
    let s = store(Mode::Packed, 16);
    let mut ctx = s.new_ctx();
    ctx.write(0, &real[..8 * PAGE_SIZE]).unwrap();
    // SAFETY: no other thread uses the store.
    let hit = unsafe { zblk::debug_corrupt_object(&s, 3, 40, 0x5a) };
    assert!(hit, "page 3 is packed");
    let mut buf = vec![0u8; PAGE_SIZE];
    for p in 0..8 {
        let e = ctx.read(p * P, &mut buf);
        if !common::same_filled(&real[p as usize * PAGE_SIZE..][..PAGE_SIZE]) {
            assert_eq!(e.unwrap_err().errno(), -libc::EIO, "page {p}");
            assert_eq!(buf, vec![0; PAGE_SIZE]);
        }
    }
}

#[test]
fn algo_none_stores_pages_raw_and_same_filled_pages_free() {
    let real = real_pages();
    for mode in [Mode::PerPage, Mode::Packed] {
        let mut cfg = StoreConfig::new(64 * P);
        cfg.algo = Algo::None;
        cfg.mode = mode;
        let s = Store::new(cfg).unwrap();
        let mut ctx = s.new_ctx();
        ctx.write(0, &real[..16 * PAGE_SIZE]).unwrap();
        ctx.write(16 * P, &vec![0u8; 8 * PAGE_SIZE]).unwrap();
        let mut back = vec![0u8; 24 * PAGE_SIZE];
        ctx.read(0, &mut back).unwrap();
        assert!(back[..16 * PAGE_SIZE] == real[..16 * PAGE_SIZE], "{mode}");
        assert!(back[16 * PAGE_SIZE..].iter().all(|&b| b == 0));
        let st = s.stats();
        let raw = (0..16)
            .filter(|&i| !common::same_filled(&real[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]))
            .count() as u64;
        assert_eq!(st.counters.huge_pages, raw, "{mode}: every other page raw");
        assert_eq!(st.counters.compr_data_size, raw * P, "{mode}");
        assert_eq!(st.counters.same_pages, 24 - raw, "{mode}");
        ctx.discard(0, 64 * P).unwrap();
        drop(ctx);
        assert_eq!(s.stats().mem_used_total, 0);
    }
}

/// A group's header with a bit of `orig` moved (page 0 absent, page 2
/// present becomes page 0 present, page 2 absent: the same count, so the
/// slot's own checks pass) would shift page 1 onto page 2's bytes; the
/// header's seal fails every page of the group instead (EIO), before any
/// position or the read cache is trusted.
#[test]
fn a_moved_bit_in_a_group_header_fails_the_group_not_shifts_it() {
    let s = store(Mode::Packed, 16);
    let mut ctx = s.new_ctx();
    let mut group = vec![0u8; 8 * PAGE_SIZE];
    for p in 1..8 {
        let text = format!("page {p} of a group, with text that compresses; ");
        let page = &mut group[p * PAGE_SIZE..(p + 1) * PAGE_SIZE];
        for (b, t) in page.iter_mut().zip(text.bytes().cycle()) {
            *b = t;
        }
    }
    ctx.write(0, &group).unwrap();
    let mut buf = vec![0u8; PAGE_SIZE];
    ctx.read(P, &mut buf).unwrap();
    assert!(buf == group[PAGE_SIZE..2 * PAGE_SIZE], "intact");
    // `orig` is the header's second word: its low byte 0b1111_1110 becomes
    // 0b1111_1011.
    // SAFETY: no other thread uses the store.
    assert!(unsafe { zblk::debug_flip_object_byte(&s, 1, 8, 0b101) });
    for p in 1..8u64 {
        let e = ctx.read(p * P, &mut buf).unwrap_err();
        assert_eq!(e.errno(), -libc::EIO, "page {p}: {e}");
        assert!(e.to_string().contains("seal"), "page {p}: {e}");
        assert_eq!(buf, vec![0; PAGE_SIZE]);
    }
    ctx.read(0, &mut buf).unwrap();
    assert_eq!(buf, vec![0; PAGE_SIZE], "the zero page is no object's");
    // Written again, the pages are whole; the corrupt group is freed.
    ctx.write(0, &group).unwrap();
    let mut back = vec![0u8; 8 * PAGE_SIZE];
    ctx.read(0, &mut back).unwrap();
    assert!(back == group);
    ctx.discard(0, 16 * P).unwrap();
    drop(ctx);
    assert!(s.settle_frees(std::time::Duration::from_secs(10)));
    assert_eq!(s.stats().mem_used_total, 0);
}
