//! Compression workers (`StoreConfig::compress_workers`): a store whose
//! requests' groups run on several threads stores and reads exactly what
//! one without workers does; a worker that never claims, or dies in a
//! group, wedges and loses nothing; an error in one group fails the
//! request once; statistics count groups where they ran.

mod common;

use common::model::{self, Model, Op};
use common::{page, real_pages, Content, Rng};
use proptest::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zblk::testing::faults;
use zblk::{Algo, Error, Mode, Store, StoreConfig, PAGE_SIZE};

const PAGES: u64 = 96;
const P: u64 = PAGE_SIZE as u64;

fn config(workers: usize, group: usize, mode: Mode) -> StoreConfig {
    let mut cfg = StoreConfig::new(PAGES * P);
    cfg.compress_workers = workers;
    cfg.group_pages = group;
    cfg.mode = mode;
    cfg
}

/// Waits (bounded) until `n` workers are parked idle, so that the next
/// request can hand its groups out.
fn wait_idle(store: &Store, n: usize) {
    let t0 = Instant::now();
    while store.debug_idle_workers() < n && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(store.debug_idle_workers() >= n, "workers never became idle");
}

/// `n` pages of mixed content (real, text, random, same-filled) from `seed`.
fn pages(n: usize, seed: u64, real: &[u8]) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    (0..n)
        .flat_map(|_| {
            let c = match r.below(8) {
                0 => Content::Zeros,
                1 => Content::SameWord(r.next()),
                2 => Content::Random(r.next()),
                3 | 4 => Content::Text(r.next()),
                _ => Content::Real(r.below(1000) as usize),
            };
            page(c, real)
        })
        .collect()
}

fn op() -> impl Strategy<Value = Op<()>> {
    let range = model::range(PAGES, 40);
    prop_oneof![
        4 => model::write(PAGES, 40),
        3 => range.clone().prop_map(|(page, n)| Op::Read { page, n }),
        1 => range.prop_map(|(page, n)| Op::Discard { page, n }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random requests on a store with workers and on one without: both
    /// read what the model says, and account the same stored bytes.
    #[test]
    fn workers_store_what_one_thread_stores(
        workers in 1usize..=2,
        group in prop_oneof![Just(1usize), Just(3), Just(8)],
        mode in prop_oneof![Just(Mode::PerPage), Just(Mode::Packed)],
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let real = real_pages();
        let with = Store::new(config(workers, group, mode)).unwrap();
        let alone = Store::new(config(0, group, mode)).unwrap();
        let (mut cw, mut ca) = (with.new_ctx(), alone.new_ctx());
        let (mut mw, mut ma) = (Model::new(PAGES), Model::new(PAGES));
        for op in ops {
            model::apply(&alone, &mut ca, &mut ma, op.clone(), &real)?;
            model::apply(&with, &mut cw, &mut mw, op, &real)?;
        }
        model::verify_all(&mut cw, &mw)?;
        let (sw, sa) = (with.stats().counters, alone.stats().counters);
        prop_assert_eq!(sw.stored_pages, sa.stored_pages);
        prop_assert_eq!(sw.compr_data_size, sa.compr_data_size);
        prop_assert_eq!(sw.same_pages, sa.same_pages);
        prop_assert_eq!(sw.huge_pages, sa.huge_pages);
        prop_assert_eq!(sw.groups, sa.groups);
        prop_assert_eq!(sw.pages_written, sa.pages_written);
        prop_assert!(sw.worker_groups <= sw.groups);
        prop_assert_eq!(sa.worker_groups, 0);
    }
}

/// Workers that are handed jobs but never claim (paused) delay nothing:
/// the queue thread runs every group, and every group counts there.
#[test]
fn paused_workers_wedge_nothing() {
    let real = real_pages();
    let store = Store::new(config(2, 8, Mode::PerPage)).unwrap();
    let mut ctx = store.new_ctx();
    wait_idle(&store, 2);
    assert!(store.debug_pause_workers(true));
    let data = pages(64, 7, &real);
    for round in 0..20u64 {
        // Both workers are handed the first request and sit on it paused.
        let at = (round % 2) * 32 * P;
        ctx.write(at, &data[..32 * PAGE_SIZE]).unwrap();
    }
    let c = store.stats().counters;
    assert_eq!(c.groups, 20 * 4, "every group written once");
    assert_eq!(c.worker_groups, 0, "a paused worker claimed a group");
    let mut buf = vec![0u8; 64 * PAGE_SIZE];
    ctx.read(0, &mut buf).unwrap();
    assert_eq!(&buf[..32 * PAGE_SIZE], &data[..32 * PAGE_SIZE]);
    assert_eq!(&buf[32 * PAGE_SIZE..], &data[..32 * PAGE_SIZE]);
    assert_eq!(store.stats().counters.worker_read_groups, 0);
    // Let go, they find their jobs' generations gone and come back idle.
    assert!(store.debug_pause_workers(false));
    wait_idle(&store, 2);
    ctx.write(0, &data).unwrap();
    ctx.read(0, &mut buf).unwrap();
    assert_eq!(buf, data);
}

/// With idle workers, groups run on them too: counted in `worker_groups`
/// (writes) and `worker_read_groups` (reads), and `groups` counts every
/// write group once wherever it ran.
#[test]
fn groups_are_counted_where_they_ran() {
    let real = real_pages();
    let store = Store::new(config(1, 8, Mode::PerPage)).unwrap();
    let mut ctx = store.new_ctx();
    let data = pages(64, 11, &real);
    let mut buf = vec![0u8; 64 * PAGE_SIZE];
    let mut rounds = 0u64;
    while rounds < 500 {
        wait_idle(&store, 1);
        ctx.write(0, &data).unwrap();
        wait_idle(&store, 1);
        ctx.read(0, &mut buf).unwrap();
        assert_eq!(buf, data, "round {rounds}");
        rounds += 1;
        let c = store.stats().counters;
        if c.worker_groups > 0 && c.worker_read_groups > 0 {
            break;
        }
    }
    let c = store.stats().counters;
    assert!(c.worker_groups > 0, "no write group ran on the worker");
    assert!(c.worker_read_groups > 0, "no read group ran on the worker");
    assert_eq!(c.groups, rounds * 8);
    assert_eq!(c.num_writes, rounds);
    assert_eq!(c.num_reads, rounds);
}

/// A group that cannot be stored (the memory limit) fails its request,
/// counted once in `failed_writes`, whichever thread ran it; the store
/// keeps working afterwards.
#[test]
fn a_failing_group_fails_the_request_once() {
    let real = real_pages();
    let mut cfg = config(2, 8, Mode::PerPage);
    cfg.mem_limit = 24 * P;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.new_ctx();
    wait_idle(&store, 2);
    // Incompressible pages: 64 of them cannot fit in 24 pages of memory.
    let data: Vec<u8> = (0..64u64)
        .flat_map(|i| page(Content::Random(i + 1), &real))
        .collect();
    let e = ctx.write(0, &data).unwrap_err();
    assert!(matches!(e, Error::NoSpace { .. }), "{e:?}");
    let c = store.stats().counters;
    assert_eq!(c.failed_writes, 1);
    assert_eq!(c.num_writes, 0);
    wait_idle(&store, 2);
    let small = pages(16, 3, &real);
    ctx.discard(0, PAGES * P).unwrap();
    ctx.flush_frees();
    store.compact();
    ctx.write(0, &small).unwrap();
    let mut buf = vec![0u8; small.len()];
    ctx.read(0, &mut buf).unwrap();
    assert_eq!(buf, small);
}

/// An allocation failure in one group on the queue thread (a failure
/// point, counted per thread: the workers are paused so that every group
/// runs there) fails the request with that group's error.
#[test]
fn a_failure_point_in_one_group_fails_the_request() {
    let real = real_pages();
    let data = pages(32, 5, &real);
    // The allocations one such request makes, on a store without workers.
    let alone = Store::new(config(0, 8, Mode::PerPage)).unwrap();
    let base = faults::passes("slab:obj");
    alone.new_ctx().write(0, &data).unwrap();
    let per_request = faults::passes("slab:obj") - base;
    assert!(per_request > 2, "too few allocations to fail one group");
    let store = Store::new(config(1, 8, Mode::PerPage)).unwrap();
    let mut ctx = store.new_ctx();
    wait_idle(&store, 1);
    // The request is handed to the (paused) worker: it goes through the
    // shared job, every group on this thread.
    assert!(store.debug_pause_workers(true));
    assert!(faults::arm("slab:obj", per_request / 2));
    let e = ctx.write(0, &data).unwrap_err();
    assert!(faults::take_fired());
    faults::disarm();
    assert!(matches!(e, Error::NoSpace { .. }), "{e:?}");
    assert_eq!(store.stats().counters.failed_writes, 1);
    store.debug_pause_workers(false);
}

/// A worker that dies in a group (a panic: its thread ends) loses nothing:
/// the queue thread runs the abandoned group again and the request
/// succeeds; later requests run without that worker.
#[test]
fn a_dying_worker_loses_no_group() {
    let real = real_pages();
    let store = Store::new(config(1, 8, Mode::PerPage)).unwrap();
    let mut ctx = store.new_ctx();
    let data = pages(64, 13, &real);
    let mut buf = vec![0u8; data.len()];
    wait_idle(&store, 1);
    assert!(store.debug_worker_panic());
    let mut died = false;
    for round in 0..500 {
        // Idle again within a second, or dead.
        let t0 = Instant::now();
        while store.debug_idle_workers() == 0 && t0.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if store.debug_idle_workers() == 0 {
            died = true;
            break;
        }
        ctx.write(0, &data).unwrap();
        ctx.read(0, &mut buf).unwrap();
        assert_eq!(buf, data, "round {round}");
    }
    assert!(died, "the worker never claimed a group");
    ctx.write(0, &data).unwrap();
    ctx.read(0, &mut buf).unwrap();
    assert_eq!(buf, data);
    assert_eq!(store.stats().counters.failed_writes, 0);
}

/// Zstd and packed groups through the workers, several queue contexts at
/// once sharing two workers: every context reads back its own pages.
#[test]
fn several_queues_share_the_workers() {
    let real = Arc::new(real_pages());
    let mut cfg = config(2, 8, Mode::Packed);
    cfg.algo = Algo::Zstd(1);
    let store = Store::new(cfg).unwrap();
    let threads: Vec<_> = (0..3u64)
        .map(|q| {
            let (store, real) = (store.clone(), real.clone());
            std::thread::spawn(move || {
                let mut ctx = store.new_ctx();
                let at = q * 32 * P;
                let mut buf = vec![0u8; 32 * PAGE_SIZE];
                for round in 0..50 {
                    let data = pages(32, q * 1000 + round, &real);
                    ctx.write(at, &data).unwrap();
                    ctx.read(at, &mut buf).unwrap();
                    assert_eq!(buf, data, "queue {q} round {round}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(store.stats().counters.groups, 3 * 50 * 4);
}

/// Minor faults of this process's thread `tid` so far (its
/// `/proc/self/task/TID/stat`, field 10), if it exists.
fn thread_faults_of(tid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // Fields after the last ')' (the name may hold spaces): state is field
    // 3, minflt field 10.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(7)?.parse().ok()
}

/// A worker's memory is faulted in before its first job (as a queue
/// thread's is by `QueueCtx::prefault`): decoding reads' groups, which
/// allocate nothing, takes it next to no page fault.
#[test]
fn a_worker_decodes_without_faulting() {
    let real = real_pages();
    let mut cfg = config(1, 8, Mode::PerPage);
    cfg.algo = Algo::Zstd(1);
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.new_ctx();
    let data = pages(64, 17, &real);
    ctx.write(0, &data).unwrap();
    wait_idle(&store, 1);
    let tid = store.debug_worker_tids()[0];
    let mut buf = vec![0u8; data.len()];
    // The request buffer, faulted in here as a queue's I/O buffers are.
    ctx.read(0, &mut buf).unwrap();
    wait_idle(&store, 1);
    let before = thread_faults_of(tid).expect("the worker's thread");
    for _ in 0..50 {
        wait_idle(&store, 1);
        ctx.read(0, &mut buf).unwrap();
        assert_eq!(buf, data);
    }
    let faults = thread_faults_of(tid).expect("the worker's thread") - before;
    let c = store.stats().counters;
    assert!(c.worker_read_groups > 0, "no group ran on the worker");
    assert!(
        faults <= 4,
        "the worker took {faults} faults decoding {} groups",
        c.worker_read_groups
    );
}
