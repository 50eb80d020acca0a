//! The free drain stalled (`Store::debug_stall_drain`: it frees nothing, as
//! a drain thread starved of CPU would) while writes, overwrites and
//! discards go on, against a model.
//!
//! What must hold (the bound is documented in `src/free.rs`):
//! - handles detached but not freed never exceed the queue's bound
//!   (`deferred_free_max_batches` x 64) plus one partial batch per queue:
//!   once the queue is full the discarding thread frees synchronously, so
//!   memory stays within that much of what the live pages need, however
//!   long the stall lasts (and the pending count does reach the bound,
//!   which shows the drain really was stalled);
//! - with a memory limit, writes either succeed or fail cleanly with
//!   ENOSPC, keeping the old content;
//! - nothing deadlocks: the workload runs on a thread the test waits for
//!   with a timeout;
//! - once the stall ends everything drains (nothing pending, the model
//!   matches, and discarding all leaves no memory charged).

mod common;

use common::{page, real_pages, Content, Rng};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;
use zblk::{Error, Mode, QueueCtx, Store, StoreConfig, PAGE_SIZE};

const PAGES: u64 = 256;
const MAX_BATCHES: usize = 8;
/// Handles the stalled drain may leave pending: the queue, plus the
/// context's own partial batch.
const BOUND: u64 = (MAX_BATCHES * 64 + 63) as u64;
const ROUNDS: usize = 40;
const TIMEOUT: Duration = Duration::from_secs(60);

fn ctx(mode: Mode, mem_limit: u64) -> QueueCtx {
    let mut cfg = StoreConfig::new(PAGES * PAGE_SIZE as u64);
    cfg.mode = mode;
    cfg.deferred_free = true;
    cfg.deferred_free_max_batches = MAX_BATCHES;
    cfg.mem_limit = mem_limit;
    Store::new(cfg).unwrap().new_ctx()
}

fn verify(ctx: &mut QueueCtx, model: &[Vec<u8>], why: &str) {
    let mut buf = vec![0u8; PAGE_SIZE];
    for (p, want) in model.iter().enumerate() {
        ctx.read((p * PAGE_SIZE) as u64, &mut buf).unwrap();
        assert!(buf == *want, "{why}: page {p} differs from the model");
    }
}

/// What one stalled run saw.
struct Seen {
    max_pending: u64,
    failed_writes: u64,
}

/// Fills the device, stalls the drain, churns ROUNDS times the device size
/// in writes and discards, checks the bound along the way, ends the stall
/// and checks that everything drains.
fn stalled_churn(mode: Mode, limit_slack: Option<u64>) -> Seen {
    let real = real_pages();
    let mut r = Rng(0xd7a1_5a11 ^ mode as u64);
    let gen = |r: &mut Rng| match r.below(3) {
        0 => page(Content::Random(r.next()), &real),
        1 => page(Content::Text(r.next()), &real),
        _ => page(Content::Real(r.below(96) as usize), &real),
    };
    let mut model: Vec<Vec<u8>> = (0..PAGES).map(|_| gen(&mut r)).collect();
    let mut c = ctx(mode, 0);
    c.write(0, &model.concat()).unwrap();
    c.flush_frees();
    let store = c.store().clone();
    let full = store.stats().mem_used_total;
    if let Some(slack) = limit_slack {
        store.set_mem_limit(full + slack);
    }
    store.debug_stall_drain(true);
    let (mut max_pending, mut failed_writes) = (0, 0);
    for round in 0..ROUNDS {
        for _ in 0..PAGES / 8 {
            let p = r.below(PAGES - 8);
            let n = 1 + r.below(8);
            if r.below(3) == 0 {
                c.discard(p * PAGE_SIZE as u64, n * PAGE_SIZE as u64)
                    .unwrap();
                for q in p..p + n {
                    model[q as usize] = vec![0; PAGE_SIZE];
                }
                continue;
            }
            let data: Vec<Vec<u8>> = (0..n).map(|_| gen(&mut r)).collect();
            match c.write(p * PAGE_SIZE as u64, &data.concat()) {
                Ok(()) => {
                    for (i, d) in data.into_iter().enumerate() {
                        model[p as usize + i] = d;
                    }
                }
                Err(e @ Error::NoSpace { .. }) if limit_slack.is_some() => {
                    // At most 8 pages: one group, kept whole at its old content.
                    assert_eq!(e.errno(), -libc::ENOSPC);
                    failed_writes += 1;
                }
                Err(e) => panic!("{mode:?} round {round}: {e}"),
            }
        }
        if round % 4 == 3 {
            let s = store.stats();
            let why = format!("{mode:?} round {round}");
            assert!(
                s.deferred_free_pending <= BOUND,
                "{why}: {} handles pending, bound {BOUND}",
                s.deferred_free_pending
            );
            // A pending object is at most a page (per page) or a group of
            // 8 (packed); dead pages inside live packed objects are packed
            // mode's own overhead (compaction's business), not the drain's.
            let object = PAGE_SIZE as u64 * if mode == Mode::Packed { 8 } else { 1 };
            let most = full + (BOUND + 64) * object;
            let held = s.mem_used_total - s.counters.packed_dead_bytes;
            assert!(held <= most, "{why}: {held} bytes held, bound {most}");
            max_pending = max_pending.max(s.deferred_free_pending);
            verify(&mut c, &model, &why);
        }
    }
    store.debug_stall_drain(false);
    c.flush_frees();
    assert!(store.settle_frees(Duration::from_secs(30)), "did not drain");
    let s = store.stats();
    assert_eq!(
        s.deferred_free_pending, 0,
        "{mode:?}: pending after the stall"
    );
    verify(&mut c, &model, &format!("{mode:?} after the stall"));
    c.discard(0, PAGES * PAGE_SIZE as u64).unwrap();
    c.flush_frees();
    assert!(store.settle_frees(Duration::from_secs(30)));
    let s = store.stats();
    assert_eq!(s.counters.stored_pages, 0);
    assert_eq!(
        s.mem_used_total, 0,
        "{mode:?}: memory left after discarding all"
    );
    Seen {
        max_pending,
        failed_writes,
    }
}

/// Runs `f` on its own thread; a hang is a failure, not a stuck test.
fn with_timeout<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(TIMEOUT) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("the stalled-drain workload hung for {TIMEOUT:?} (deadlock?)")
        }
        // The worker panicked: report its panic.
        Err(mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the worker sends before it returns"),
        },
    }
}

#[test]
fn stalled_drain_keeps_memory_bounded_and_drains_after() {
    for mode in [Mode::PerPage, Mode::Packed] {
        let seen = with_timeout(move || stalled_churn(mode, None));
        assert!(
            seen.max_pending >= (MAX_BATCHES * 64) as u64,
            "{mode:?}: pending peaked at {}: the drain was not stalled",
            seen.max_pending
        );
    }
}

#[test]
fn stalled_drain_under_a_memory_limit_fails_writes_cleanly() {
    for mode in [Mode::PerPage, Mode::Packed] {
        // Room for a little more than the queue's bound of objects.
        let slack = 64 * PAGE_SIZE as u64;
        let seen = with_timeout(move || stalled_churn(mode, Some(slack)));
        eprintln!("{mode:?}: {} writes refused", seen.failed_writes);
        assert!(seen.failed_writes > 0, "{mode:?}: the limit was never met");
    }
}
