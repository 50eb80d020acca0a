//! The memory reserve with its provisioner stalled (its own test binary:
//! the stall point is process-wide). In a swap storm the provisioner's page
//! faults can wait in reclaim for seconds; meanwhile a write whose classes
//! have no room must come back within its bounded waits, as ENOSPC, never
//! hang, and keep every slot's old content, and the writing thread must
//! not fault in memory of its own; once the provisioner runs again, writes
//! succeed again.

mod common;

use common::{page, real_pages, thread_faults, Content};
use std::time::{Duration, Instant};
use zblk::testing::faults::stall_provisioner;
use zblk::{Error, Mode, Store, StoreConfig, PAGE_SIZE};

const PAGES: usize = 1024;
const GROUP: usize = 8;

fn config(mode: Mode) -> StoreConfig {
    let mut cfg = StoreConfig::new((2 * PAGES * PAGE_SIZE) as u64);
    cfg.shared = true;
    cfg.reserve = true;
    // As when free memory is short: zspages only from the reserve.
    cfg.reserve_free_below = u64::MAX;
    cfg.mode = mode;
    cfg
}

fn stalled_provisioner_fails_writes_in_bounded_time(mode: Mode) {
    let real = real_pages();
    let data: Vec<u8> = (0..PAGES)
        .flat_map(|i| page(Content::Real(i * 5 + 1), &real))
        .collect();
    let store = Store::new(config(mode)).unwrap();
    let mut ctx = store.new_ctx();
    // A first write, so that the provisioner has classes to fill.
    ctx.write(0, &data[..GROUP * PAGE_SIZE]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    stall_provisioner(true);
    let faults0 = thread_faults();
    let mut ok = [false; PAGES / GROUP];
    ok[0] = true;
    let (mut refused, mut slowest) = (0, Duration::ZERO);
    for (g, d) in data.chunks(GROUP * PAGE_SIZE).enumerate().skip(1) {
        let t = Instant::now();
        match ctx.write((g * GROUP * PAGE_SIZE) as u64, d) {
            Ok(()) => ok[g] = true,
            Err(Error::NoSpace { .. }) => refused += 1,
            Err(e) => panic!("group {g}: {e}"),
        }
        slowest = slowest.max(t.elapsed());
    }
    let faults = thread_faults() - faults0;
    stall_provisioner(false);
    eprintln!(
        "{mode:?}: {refused} of {} groups refused, slowest write {slowest:?}, writer faults {faults}",
        ok.len()
    );
    assert!(refused > 0, "the spares alone held every group");
    // Nor does the writer fault in memory of its own meanwhile (an owner
    // table from the heap, a list grown): the spares' pages and their
    // tables are the provisioner's to make.
    assert!(faults < 64, "the writer took {faults} page faults");
    // Five waits of 10 ms for the provisioner, per missed object batch:
    // far below a second even on a loaded host.
    assert!(slowest < Duration::from_secs(2), "a write took {slowest:?}");
    let mut back = vec![0u8; GROUP * PAGE_SIZE];
    for (g, d) in data.chunks(GROUP * PAGE_SIZE).enumerate() {
        ctx.read((g * GROUP * PAGE_SIZE) as u64, &mut back).unwrap();
        if ok[g] {
            assert!(back == d, "group {g}: a stored page differs");
        } else {
            assert!(
                back.iter().all(|&b| b == 0),
                "group {g}: a refused write left bytes"
            );
        }
    }
    // The provisioner runs again: the refused groups go in now.
    std::thread::sleep(Duration::from_millis(300));
    for (g, d) in data.chunks(GROUP * PAGE_SIZE).enumerate() {
        if !ok[g] {
            retry(&mut ctx, g, d);
        }
    }
}

/// Writes group `g` until the provisioner has made room (a few passes).
fn retry(ctx: &mut zblk::QueueCtx, g: usize, d: &[u8]) {
    let off = (g * GROUP * PAGE_SIZE) as u64;
    for _ in 0..100 {
        match ctx.write(off, d) {
            Ok(()) => {
                let mut back = vec![0u8; d.len()];
                ctx.read(off, &mut back).unwrap();
                assert!(back == d, "group {g}: differs after the retry");
                return;
            }
            Err(Error::NoSpace { .. }) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("group {g}: {e}"),
        }
    }
    panic!("group {g}: still refused with the provisioner running");
}

// One test for both modes: the stall point is process-wide, and tests of
// one binary run side by side.
#[test]
fn stalled_provisioner_fails_writes_in_bounded_time_both_modes() {
    stalled_provisioner_fails_writes_in_bounded_time(Mode::PerPage);
    stalled_provisioner_fails_writes_in_bounded_time(Mode::Packed);
}
