//! A store on the heap allocator that is dropped while it holds pages
//! frees them (found by the fuzzers' LeakSanitizer): the bytes this process
//! has allocated return to their level before the store, within slack for
//! the store's own threads and buffers, far less than the pages written.

mod common;

use common::{page, Content};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use zblk::{AllocatorKind, Store, StoreConfig, PAGE_SIZE};

struct Counting;

static NET: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        NET.fetch_add(l.size() as i64, Relaxed);
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        NET.fetch_sub(l.size() as i64, Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

#[test]
fn heap_store_dropped_with_pages_frees_them() {
    const PAGES: u64 = 256;
    let data: Vec<u8> = (0..PAGES)
        .flat_map(|i| page(Content::Random(i + 1), &[]))
        .collect();
    let before = NET.load(Relaxed);
    {
        let mut cfg = StoreConfig::new(PAGES * PAGE_SIZE as u64);
        cfg.allocator = AllocatorKind::Heap;
        cfg.deferred_free = false;
        let store = Store::new(cfg).unwrap();
        let mut ctx = store.new_ctx();
        ctx.write(0, &data).unwrap();
        assert_eq!(store.stats().counters.huge_pages, PAGES);
    }
    let left = NET.load(Relaxed) - before;
    assert!(
        left < 256 << 10,
        "{left} bytes still allocated after the store was dropped (the pages were 1 MB)"
    );
}
