//! The memory reserve's provisioner is the one thread of an I/O flusher
//! (the daemon: `PR_SET_IO_FLUSHER` before any thread exists) whose reclaim
//! may write pages out and reach the OOM killer: it serves no I/O, and as
//! an I/O flusher its faults below the min watermark could neither swap
//! anything out nor ever be answered by the OOM killer. Checked in the
//! kernel's own words: the `PF_MEMALLOC_NOIO` bit of each thread's flags
//! in /proc. Needs `CAP_SYS_RESOURCE` (the test suite runs as root); it
//! says so and checks nothing without it.

use zblk::{Store, StoreConfig, PAGE_SIZE};

const PR_SET_IO_FLUSHER: libc::c_int = 57;
/// include/linux/sched.h: allocations of this task are `GFP_NOIO`.
const PF_MEMALLOC_NOIO: u64 = 0x0008_0000;

/// The flags (field 9) in the text of a thread's /proc stat file.
fn stat_flags(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(") ")?;
    // After ") ": state(3) ppid pgrp session tty_nr tpgid flags(9).
    rest.split_whitespace().nth(6)?.parse().ok()
}

/// The flags of the thread named `name` in this process; `None` when
/// there is none.
fn thread_flags(name: &str) -> Option<u64> {
    for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            return stat_flags(&std::fs::read_to_string(t.path().join("stat")).ok()?);
        }
    }
    None
}

#[test]
fn the_provisioner_of_an_io_flusher_reclaims_with_io() {
    // SAFETY: prctl with integer arguments has no memory effects; it sets
    // this thread's flags, inherited by the threads it starts.
    if unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) } != 0 {
        eprintln!(
            "skipped: PR_SET_IO_FLUSHER refused ({}): needs CAP_SYS_RESOURCE",
            std::io::Error::last_os_error()
        );
        return;
    }
    let mut cfg = StoreConfig::new(64 * PAGE_SIZE as u64);
    cfg.shared = true;
    cfg.reserve = true;
    let store = Store::new(cfg).expect("a store with a reserve");
    let own = std::fs::read_to_string("/proc/thread-self/stat").expect("own stat");
    let own_flags = stat_flags(&own).expect("own flags");
    assert_ne!(
        own_flags & PF_MEMALLOC_NOIO,
        0,
        "this thread is an I/O flusher"
    );
    // The provisioner clears its flag as it starts: give it a moment.
    let mut flags = None;
    for _ in 0..200 {
        flags = thread_flags("zblk-reserve");
        if flags.is_some_and(|f| f & PF_MEMALLOC_NOIO == 0) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let flags = flags.expect("the store has a zblk-reserve thread");
    assert_eq!(
        flags & PF_MEMALLOC_NOIO,
        0,
        "the provisioner is still an I/O flusher (flags {flags:#x})"
    );
    drop(store);
}
