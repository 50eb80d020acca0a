//! Dropping, once a daemon or keeper has hardened itself, every capability
//! it will not use again, and setting `no_new_privs`.
//!
//! What is kept, and why (each checked against the code paths that run
//! after the drop):
//!
//! - `CAP_SYS_ADMIN`, always: the driver asks for it on every control
//!   command of a device created without `UBLK_F_UNPRIVILEGED_DEV`, and a
//!   daemon issues them until it exits (`START_DEV`, `GET_DEV_INFO`,
//!   `STOP_DEV`, `DEL_DEV`, `QUIESCE_DEV`, and `START/END_USER_RECOVERY`
//!   in a recovering daemon); the keeper issues `DEL_DEV` when it gives up
//!   and reads the device's state; `swapon` (a foreground daemon's `--swap`)
//!   needs it too.
//! - `CAP_IPC_LOCK`, always: `mlockall(MCL_FUTURE)` keeps locking every
//!   new mapping (the slab's zspages, I/O buffers, thread stacks) beyond
//!   `RLIMIT_MEMLOCK`, and the keeper `mlock`s the store while no daemon
//!   maps it.
//! - `CAP_SYS_RESOURCE` and `CAP_SETPCAP`, only in a process that starts
//!   zblk processes (the keeper starts daemons; a daemon with a keeper
//!   starts a new keeper if its own dies). Each of those hardens
//!   itself at start (`PR_SET_IO_FLUSHER` and `oom_score_adj` -1000 both
//!   need `CAP_SYS_RESOURCE`), then drops its own bounding set to its kept
//!   set (`PR_CAPBSET_DROP` needs `CAP_SETPCAP`, which only removes); and a
//!   root process's capabilities after `execve` are at most its parent's
//!   bounding set: a parent that dropped them could never start one again.
//! - `CAP_SYS_RAWIO`, only with `deflate-iaa`: mapping an IAA work queue's
//!   portal needs it on CPUs affected by INTEL-SA-01084; without it the
//!   codec falls back to `write()` or to software, silently slower.
//!
//! Everything else goes, from the bounding, permitted, effective and
//! inheritable sets (the ambient set is cleared): files under `/run/zblk`
//! and `/dev/ublk*` are root's own, so no `CAP_DAC_*` or `CAP_FOWNER` is
//! needed to reach them; `CAP_SETPCAP`, used for the drop itself, goes
//! last (from the permitted set) where nothing is started.
//!
//! **`no_new_privs` and the keeper's restarts.** Both the keeper and the
//! daemon set it. It does not stop the keeper from starting a working
//! daemon: the daemon runs as uid 0, whose capabilities after `execve`
//! are the parent's bounding set (here: the kept set), and `no_new_privs`
//! only caps them at the parent's permitted set, the same kept set. So
//! the new daemon starts with exactly the set the keeper kept, in its
//! effective set as root's are, without ambient capabilities (those are
//! for non-root programs), and drops it again to its own.
//!
//! Capabilities are per thread and threads inherit their creator's: the
//! drop runs on the main thread before any other thread exists, so every
//! thread of the process has the kept set.

use crate::error::{Error, Result, Step};
use caps::{CapSet, Capability, CapsHashSet};

/// What a process does after the drop that needs more than the base set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    /// It starts zblk daemons or keepers, which harden themselves.
    pub starts_zblk: bool,
    /// It opens IAA work queues (`deflate-iaa`).
    pub iaa: bool,
}

/// The capabilities a process with `needs` keeps.
pub fn kept(needs: Needs) -> CapsHashSet {
    let mut set = CapsHashSet::from([Capability::CAP_SYS_ADMIN, Capability::CAP_IPC_LOCK]);
    if needs.starts_zblk {
        set.insert(Capability::CAP_SYS_RESOURCE);
        set.insert(Capability::CAP_SETPCAP);
    }
    if needs.iaa {
        set.insert(Capability::CAP_SYS_RAWIO);
    }
    set
}

/// The kept set as the bit mask `/proc/PID/status` shows (`CapEff`).
pub fn mask(set: &CapsHashSet) -> u64 {
    set.iter().fold(0, |m, c| m | c.bitmask())
}

/// Drops every capability but [`kept`] from the calling thread's bounding,
/// permitted, effective and inheritable sets, clears its ambient set and
/// sets `no_new_privs`. Returns what it kept (less what the thread did not
/// have). Call it on the main thread before other threads start.
pub fn drop_to(needs: Needs) -> Result<CapsHashSet> {
    let want = kept(needs);
    let fail = |e: caps::errors::CapsError| Error::Os {
        step: Step::DropCapabilities,
        source: std::io::Error::other(e.to_string()),
    };
    // Ambient capabilities exist since Linux 4.3; a kernel without them
    // has none to clear.
    if caps::runtime::ambient_set_supported().is_ok() {
        caps::clear(None, CapSet::Ambient).map_err(fail)?;
    }
    // The bounding set first: dropping from it needs CAP_SETPCAP, which
    // the permitted set is about to lose.
    for c in caps::read(None, CapSet::Bounding).map_err(fail)? {
        if !want.contains(&c) {
            caps::drop(None, CapSet::Bounding, c).map_err(fail)?;
        }
    }
    caps::clear(None, CapSet::Inheritable).map_err(fail)?;
    let permitted = caps::read(None, CapSet::Permitted).map_err(fail)?;
    let keep: CapsHashSet = want.intersection(&permitted).copied().collect();
    // Effective before permitted: the kernel refuses an effective set
    // larger than the permitted one.
    caps::set(None, CapSet::Effective, &keep).map_err(fail)?;
    caps::set(None, CapSet::Permitted, &keep).map_err(fail)?;
    set_no_new_privs()?;
    Ok(keep)
}

/// `prctl(PR_SET_NO_NEW_PRIVS, 1)`: no program this process starts gains
/// privileges it does not have (setuid bits, file capabilities).
fn set_no_new_privs() -> Result<()> {
    // SAFETY: prctl with integer arguments has no memory effects.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if r != 0 {
        return Err(Error::last_os(Step::NoNewPrivs));
    }
    Ok(())
}

/// The names of `set`, sorted, for the log.
pub fn names(set: &CapsHashSet) -> String {
    let mut v: Vec<String> = set.iter().map(|c| c.to_string()).collect();
    v.sort();
    v.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Set in the child that [`drop_leaves_exactly_the_kept_set`] starts.
    const CHILD: &str = "ZBLK_PRIVILEGES_CHILD";

    fn status_field(status: &str, key: &str) -> u64 {
        let v = status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("{key} missing"));
        u64::from_str_radix(v.trim(), 16).unwrap()
    }

    /// The child's half: drops, then prints the thread's sets as the
    /// kernel shows them. (`thread-self`: capabilities are per thread and
    /// the test runs on one of the harness's threads, so `/proc/self`,
    /// the main thread, would show the sets from before the drop.)
    #[test]
    fn drop_in_child() {
        let Ok(which) = std::env::var(CHILD) else {
            return;
        };
        let needs = Needs {
            starts_zblk: which.contains("starts"),
            iaa: which.contains("iaa"),
        };
        let kept = drop_to(needs).unwrap();
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let get = |k| status_field(&status, k);
        println!(
            "RESULT kept={:x} eff={:x} prm={:x} inh={:x} bnd={:x} amb={:x} nnp={}",
            mask(&kept),
            get("CapEff:"),
            get("CapPrm:"),
            get("CapInh:"),
            get("CapBnd:"),
            get("CapAmb:"),
            status
                .lines()
                .find_map(|l| l.strip_prefix("NoNewPrivs:"))
                .unwrap()
                .trim()
        );
    }

    /// Runs [`drop_in_child`] in a new process (the drop cannot be undone)
    /// and checks every set against the documented one.
    #[test]
    fn drop_leaves_exactly_the_kept_set() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: dropping capabilities needs root (the tests run as root in CI)");
            return;
        }
        const SYS_ADMIN: u64 = 1 << 21;
        const IPC_LOCK: u64 = 1 << 14;
        const SYS_RESOURCE: u64 = 1 << 24;
        const SYS_RAWIO: u64 = 1 << 17;
        const SETPCAP: u64 = 1 << 8;
        // What this process may keep at most (a container may lack some).
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let have = status_field(&status, "CapPrm:") & status_field(&status, "CapBnd:");
        for (which, want) in [
            ("plain", SYS_ADMIN | IPC_LOCK),
            ("starts", SYS_ADMIN | IPC_LOCK | SYS_RESOURCE | SETPCAP),
            (
                "starts iaa",
                SYS_ADMIN | IPC_LOCK | SYS_RESOURCE | SETPCAP | SYS_RAWIO,
            ),
        ] {
            let want = want & have;
            let out = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "privileges::tests::drop_in_child", "--nocapture"])
                .env(CHILD, which)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{which}: {text}");
            let line = text
                .lines()
                .find(|l| l.starts_with("RESULT"))
                .unwrap_or_else(|| panic!("{which}: no result in {text}"));
            assert_eq!(
                line,
                format!(
                    "RESULT kept={want:x} eff={want:x} prm={want:x} inh=0 bnd={want:x} amb=0 nnp=1"
                ),
                "{which}"
            );
        }
    }

    #[test]
    fn the_kept_sets_are_the_documented_ones() {
        let n = |starts_zblk, iaa| Needs { starts_zblk, iaa };
        assert_eq!(names(&kept(n(false, false))), "CAP_IPC_LOCK CAP_SYS_ADMIN");
        assert_eq!(
            names(&kept(n(true, false))),
            "CAP_IPC_LOCK CAP_SETPCAP CAP_SYS_ADMIN CAP_SYS_RESOURCE"
        );
        assert_eq!(mask(&kept(n(false, false))), (1 << 21) | (1 << 14));
        assert!(kept(n(false, true)).contains(&Capability::CAP_SYS_RAWIO));
    }
}
