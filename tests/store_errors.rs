//! Errors, limits and statistics of the store.

mod common;

use common::{page, real_pages, Content};
use zblk::{Error, Store, StoreConfig, PAGE_SIZE};

const P: u64 = PAGE_SIZE as u64;

#[test]
fn bad_sizes_are_refused() {
    for size in [0, 4095, 4097, 512] {
        assert!(
            matches!(
                Store::new(StoreConfig::new(size)),
                Err(Error::InvalidConfig(_))
            ),
            "{size}"
        );
    }
    let mut cfg = StoreConfig::new(P);
    cfg.group_pages = 0;
    assert!(Store::new(cfg).is_err());
    // 2^36 pages (256 TiB) at most: the shared-memory layout's slot room
    // and a packed header's `base` field. Refused before any allocation.
    let most = (1u64 << 36) * P;
    match Store::new(StoreConfig::new(most + P)) {
        Err(Error::InvalidConfig(m)) => assert!(m.contains("256 TiB"), "{m}"),
        Err(e) => panic!("a 256 TiB + 4 KB store: {e}"),
        Ok(_) => panic!("a 256 TiB + 4 KB store was made"),
    }
}

#[test]
fn range_errors_have_errnos_and_count_as_invalid_io() {
    let store = Store::new(StoreConfig::new(16 * P)).unwrap();
    let mut ctx = store.new_ctx();
    let mut buf = vec![0u8; PAGE_SIZE];
    assert_eq!(ctx.read(512, &mut buf).unwrap_err().errno(), -libc::EINVAL);
    assert_eq!(
        ctx.read(16 * P, &mut buf).unwrap_err().errno(),
        -libc::EINVAL
    );
    assert!(
        ctx.discard(u64::MAX - 4095, P).is_err(),
        "overflowing range"
    );
    assert!(
        ctx.read(0, &mut buf[..100]).is_err(),
        "buffer not a page multiple"
    );
    assert_eq!(store.stats().counters.invalid_io, 4);
    // Zero-length requests are harmless no-ops.
    ctx.write(0, &[]).unwrap();
    ctx.discard(16 * P, 0).unwrap();
}

#[test]
fn mem_limit_refuses_writes_and_keeps_old_content() {
    let mut cfg = StoreConfig::new(64 * P);
    cfg.mem_limit = 8 * P;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.new_ctx();
    let old = page(Content::Text(1), &[]);
    ctx.write(0, &old).unwrap();
    // Incompressible pages are stored raw: 64 of them exceed 8 pages.
    let big: Vec<u8> = (0..64)
        .flat_map(|i| page(Content::Random(i + 7), &[]))
        .collect();
    let e = ctx.write(0, &big).unwrap_err();
    assert_eq!(e.errno(), -libc::ENOSPC, "{e}");
    let mut buf = vec![0u8; PAGE_SIZE];
    ctx.read(0, &mut buf).unwrap();
    assert_eq!(buf, old, "the failed group left page 0 alone");
    assert!(store.stats().counters.failed_writes >= 1);
    // Raising the limit at run time lets the write through.
    store.set_mem_limit(0);
    ctx.write(0, &big).unwrap();
    ctx.read(63 * P, &mut buf).unwrap();
    assert_eq!(buf, &big[63 * PAGE_SIZE..]);
}

#[test]
fn stats_track_page_kinds_and_latency() {
    let real = real_pages();
    let store = Store::new(StoreConfig::new(64 * P)).unwrap();
    let mut ctx = store.new_ctx();
    let mut data = page(Content::Zeros, &real);
    data.extend(page(Content::SameWord(0xdead_beef), &real));
    data.extend(page(Content::Random(3), &real));
    data.extend(page(Content::Real(5), &real));
    ctx.write(0, &data).unwrap();
    let s = store.stats();
    assert_eq!(s.counters.stored_pages, 4);
    assert_eq!(s.counters.same_pages, 2);
    assert_eq!(s.counters.huge_pages, 1);
    assert_eq!(
        s.counters.orig_data_size,
        4 * P,
        "same-filled pages count, as in zram"
    );
    assert!(s.counters.compr_data_size > P && s.counters.compr_data_size < 2 * P);
    assert!(s.mem_used_total >= s.counters.compr_data_size);
    assert_eq!(s.latency.write.count, 4);
    assert_eq!(s.slot_table_bytes, 64 * 16);
    ctx.discard(0, 4 * P).unwrap();
    let s = store.stats();
    assert_eq!(
        (
            s.counters.stored_pages,
            s.counters.same_pages,
            s.counters.huge_pages
        ),
        (0, 0, 0)
    );
    assert_eq!(s.counters.notify_free, 4);
    drop(ctx);
    assert_eq!(store.stats().mem_used_total, 0, "every object freed");
    let json = serde_json::to_value(store.stats()).unwrap();
    for key in [
        "orig_data_size",
        "compr_data_size",
        "mem_used_total",
        "mem_limit",
        "mem_used_max",
        "same_pages",
        "pages_compacted",
        "huge_pages",
        "failed_reads",
        "failed_writes",
        "invalid_io",
        "notify_free",
        "stored_pages",
        "deferred_free_pending",
        "latency",
    ] {
        assert!(json.get(key).is_some(), "{key} missing from stats JSON");
    }
}

#[test]
fn corrupt_object_is_an_error_not_a_wrong_page() {
    let store = Store::new(StoreConfig::new(4 * P)).unwrap();
    let mut ctx = store.new_ctx();
    ctx.write(0, &page(Content::Text(9), &[])).unwrap();
    // Corrupt the stored object through the allocator, as a bit flip would.
    // SAFETY: no other thread uses the store.
    let hit = unsafe { zblk::debug_corrupt_object(&store, 0, 0, 0xff) };
    assert!(hit, "page 0 is compressed");
    let mut buf = vec![0x55u8; PAGE_SIZE];
    let e = ctx.read(0, &mut buf).unwrap_err();
    assert_eq!(e.errno(), -libc::EIO, "{e}");
    assert_eq!(buf, vec![0; PAGE_SIZE], "no partly decoded page handed out");
    assert_eq!(store.stats().counters.failed_reads, 1);
}
