//! The memory reserve (`StoreConfig::reserve`, the daemon's setting): while
//! free memory is short (forced here with `reserve_free_below`), the
//! writing thread takes no page fault for the store's memory, whatever the
//! store grows by, because a provisioner thread backs zspages ahead of
//! need; a reserve that cannot be filled (the memory limit) fails writes
//! cleanly, keeping every slot's old content.

mod common;

use common::{keep_heap, page, real_pages, thread_faults, Content};
use zblk::{Error, Mode, Store, StoreConfig, PAGE_SIZE};

const PAGES: u64 = 6144;

fn data() -> Vec<u8> {
    let real = real_pages();
    (0..PAGES as usize)
        .flat_map(|i| page(Content::Real(i * 7 + 3), &real))
        .collect()
}

fn config(reserve: bool, mode: Mode) -> StoreConfig {
    let mut cfg = StoreConfig::new(2 * PAGES * PAGE_SIZE as u64);
    cfg.shared = true;
    cfg.reserve = reserve;
    // As when free memory is short: zspages only from the reserve.
    cfg.reserve_free_below = u64::MAX;
    cfg.mode = mode;
    cfg
}

/// Writes `data` at the start of a new store in groups of 8 pages, after
/// a warm-up write at the far end (codec scratch, first spares); returns
/// the faults the writing thread took for the main writes, and the store.
fn grow(cfg: StoreConfig, data: &[u8]) -> (u64, std::sync::Arc<Store>) {
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.new_ctx();
    let mut back = vec![0u8; 8 * PAGE_SIZE];
    let far = PAGES * PAGE_SIZE as u64;
    ctx.write(far, &data[..8 * PAGE_SIZE]).unwrap();
    ctx.read(far, &mut back).unwrap();
    let before = thread_faults();
    for chunk in data.chunks(8 * PAGE_SIZE).enumerate() {
        let (i, d) = chunk;
        ctx.write((i * 8 * PAGE_SIZE) as u64, d).unwrap();
    }
    let faults = thread_faults() - before;
    let mut got = vec![0u8; data.len()];
    ctx.read(0, &mut got).unwrap();
    assert!(got == data, "a page read back differs");
    (faults, store)
}

fn writer_takes_no_fault(mode: Mode) {
    keep_heap();
    let data = data();
    let (without, _) = grow(config(false, mode), &data);
    let (with, store) = grow(config(true, mode), &data);
    let st = store.stats();
    eprintln!(
        "{mode:?}: writer faults without reserve {without}, with {with}; \
         misses {} fallbacks {} refusals {} spare {} kB",
        st.reserve_misses,
        st.reserve_fallbacks,
        st.reserve_refusals,
        st.mem_spare / 1024
    );
    // Without the reserve the writer backs every new zspage itself.
    assert!(without > 500, "only {without} faults without the reserve");
    // With it, the faults left are the thread's own (stack, TLS): a few.
    assert!(
        with * 50 < without,
        "{with} faults with the reserve, {without} without"
    );
    assert_eq!(st.reserve_refusals, 0);
}

#[test]
fn writer_takes_no_fault_per_page() {
    writer_takes_no_fault(Mode::PerPage);
}

#[test]
fn writer_takes_no_fault_packed() {
    writer_takes_no_fault(Mode::Packed);
}

/// With free memory above the threshold the writer backs new zspages
/// itself (a fault then costs less than waiting for the provisioner): no
/// miss, and the faults are the writer's.
#[test]
fn plenty_of_free_memory_writer_backs_itself() {
    keep_heap();
    let data = data();
    let mut cfg = config(true, Mode::PerPage);
    cfg.reserve_free_below = 1;
    let (faults, store) = grow(cfg, &data);
    let st = store.stats();
    assert_eq!(st.reserve_misses, 0, "{st:?}");
    // (The provisioner fills spares meanwhile, so the split varies with
    // scheduling: hundreds on a quiet host, 40 once on a loaded one,
    // where 50 was the bound; with the reserve forced the writer takes a
    // few at most, its stack's and TLS's.)
    assert!(faults > 10, "only {faults} faults: the writer did not back");
}

/// Under a memory limit the provisioner cannot charge new spares: writes
/// past what the reserve holds fail with the limit's error after the
/// bounded wait, are counted, and leave every slot as it was.
#[test]
fn reserve_refuses_at_the_limit_and_keeps_old_pages() {
    let data = data();
    let mut cfg = config(true, Mode::PerPage);
    cfg.mem_limit = 2 << 20;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.new_ctx();
    let mut written = 0;
    let mut err = None;
    for (i, d) in data.chunks(8 * PAGE_SIZE).enumerate() {
        match ctx.write((i * 8 * PAGE_SIZE) as u64, d) {
            Ok(()) => written = i + 1,
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let err = err.expect("2 MB cannot hold 24 MB of pages");
    assert!(
        matches!(err, Error::NoSpace { limit } if limit == 2 << 20),
        "want the limit's error, got {err:?}"
    );
    let st = store.stats();
    assert!(st.reserve_refusals > 0, "{st:?}");
    assert!(st.mem_used_total <= 2 << 20);
    // What was written reads back; the group that failed reads as before
    // (never written: zeros).
    let mut got = vec![0u8; written * 8 * PAGE_SIZE];
    ctx.read(0, &mut got).unwrap();
    assert!(got[..] == data[..got.len()], "a stored page changed");
    let mut next = vec![1u8; 8 * PAGE_SIZE];
    ctx.read((written * 8 * PAGE_SIZE) as u64, &mut next)
        .unwrap();
    assert!(next.iter().all(|&b| b == 0), "the refused write left bytes");
    // Discarding everything gives the memory back down to the reserve.
    ctx.discard(0, 2 * PAGES * PAGE_SIZE as u64).unwrap();
    ctx.flush_frees();
    assert!(store.settle_frees(std::time::Duration::from_secs(5)));
    let st = store.stats();
    assert_eq!(st.counters.stored_pages, 0);
    // (mem_spare counts the spares' pages; their owner tables are charged
    // too, a few hundred bytes each.)
    assert!(
        st.mem_used_total <= st.mem_spare + st.mem_spare / 4,
        "{} bytes held beyond the {} of spares",
        st.mem_used_total,
        st.mem_spare
    );
}

/// A writer that grew its heap while memory was plentiful (the owner
/// tables of the zspages it made, which outlive its prefaulted room) still
/// has heap room once memory runs short: its first request then frees
/// the room it held, and what it allocates next faults nothing. Without
/// that room such an allocation is the first touch that, in a daemon,
/// leaves a queue thread in direct reclaim with every swap write behind
/// it.
#[test]
fn a_writer_keeps_heap_room_for_when_memory_runs_short() {
    keep_heap();
    let real = real_pages();
    let mut cfg = config(true, Mode::PerPage);
    cfg.reserve_free_below = 1;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.new_ctx();
    ctx.prefault();
    // Memory plentiful: the writer makes zspages and their owner tables.
    let mut batch = Vec::with_capacity(8 * PAGE_SIZE);
    for i in 0..PAGES as usize / 8 {
        batch.clear();
        for p in 0..8 {
            batch.extend_from_slice(&page(Content::Real(i * 8 + p), &real));
        }
        ctx.write((i * 8 * PAGE_SIZE) as u64, &batch).unwrap();
    }
    // Whatever room the prefault left is used up, as by many more zspages.
    let eaten: Vec<Box<[u8; 256]>> = (0..16 << 10).map(|_| Box::new([7u8; 256])).collect();
    store.debug_set_reserve_free_below(u64::MAX);
    let mut back = vec![0u8; PAGE_SIZE];
    ctx.read(0, &mut back).unwrap();
    let before = thread_faults();
    let v = vec![1u8; 768 << 10];
    let faults = thread_faults() - before;
    assert!(
        faults < 8,
        "{faults} faults for 768 KB allocated once memory ran short"
    );
    // Plentiful again: the room is taken back (its faults are served from
    // free memory), and the store still serves.
    store.debug_set_reserve_free_below(1);
    drop(v);
    ctx.read(0, &mut back).unwrap();
    assert!(back == page(Content::Real(0), &real));
    drop(eaten);
}
