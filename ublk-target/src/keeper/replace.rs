//! The daemon's side of its keeper: noticing that the keeper died and
//! starting a new one, so that the next daemon crash is survived again.
//!
//! A daemon that a keeper started (a fresh one with `--keeper-fd`, or a
//! recovering one) watches its parent, the keeper, through a pidfd that
//! the control loop polls. When the keeper dies (`kill -9`; it is mlocked
//! with `oom_score_adj` -1000, so rarely anything else), the daemon goes
//! on serving and starts `zblk keeper --adopt PID --link-fd FD`: the new
//! keeper gets the store's memfd over the link (`SCM_RIGHTS`, as a daemon
//! hands it to its first keeper), binds the keeper socket, answers
//! [`link::READY`], and from then on watches this daemon as the old one
//! did. It is this daemon's child, not its parent, so it cannot read the
//! daemon's exit status: the daemon says [`link::DELETED`] or
//! [`link::HANDOVER`] on the link before a clean exit, and dying with
//! nothing said is a crash ([`super::link`]).
//!
//! **Memory.** The keeper is started with `posix_spawn` (no `pre_exec`,
//! so no copy of the daemon's address space: the link is made inheritable
//! beforehand instead), from the zblk binary whose pages the daemon keeps
//! resident (it maps the same file, under `mlockall`); the new keeper
//! needs its own few hundred KB. Nothing else is allocated but a few
//! strings.
//!
//! **Crash loops.** A keeper that keeps dying (or cannot be started) is
//! replaced at most [`policy::GIVE_UP_CRASHES`] times within
//! [`policy::GIVE_UP_WINDOW`]; then the daemon logs one line and serves on
//! without a keeper (its own crash is then fatal, as with
//! `--no-recovery`). A failed start is retried at the next control-loop
//! tick, each try counted.

use super::link;
use super::policy::{self, CrashWindow};
use super::spawn::{pidfd_open, poll_in};
use crate::config::DeviceConfig;
use crate::error::{Error, Result, Step};
use crate::fdpass;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a new keeper may take to say it holds the store.
const KEEPER_READY: Duration = Duration::from_secs(10);

/// A daemon's watch on its keeper.
pub struct KeeperWatch {
    /// The keeper's process id.
    pid: u32,
    /// Readable once the keeper has exited; `None` while there is none to
    /// watch (not started yet, or given up).
    pidfd: Option<OwnedFd>,
    /// A keeper this daemon started (reaped when it dies).
    child: Option<Child>,
    /// The link to that keeper.
    link: Option<UnixStream>,
    /// Keeper deaths and failed starts, for giving up.
    deaths: CrashWindow,
    /// No keeper runs and one should be started.
    needed: bool,
}

impl KeeperWatch {
    /// Watches this process's parent, the keeper that started it. A
    /// parent already gone (reparented before the watch began) is
    /// replaced at the first tick.
    pub fn parent() -> KeeperWatch {
        // SAFETY: getppid has no preconditions.
        let ppid = unsafe { libc::getppid() } as u32;
        let pidfd = pidfd_open(ppid).ok();
        // SAFETY: as above.
        let same = unsafe { libc::getppid() } as u32 == ppid;
        let needed = pidfd.is_none() || !same || ppid <= 1;
        KeeperWatch {
            pid: ppid,
            pidfd: if needed { None } else { pidfd },
            child: None,
            link: None,
            deaths: CrashWindow::default(),
            needed,
        }
    }

    /// The descriptor to poll (-1: none, which poll ignores).
    pub fn fd(&self) -> RawFd {
        self.pidfd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }

    /// Whether a keeper should be started now (the watched one is gone,
    /// or the last start failed).
    pub fn needs_keeper(&self) -> bool {
        self.needed
            || self
                .pidfd
                .as_ref()
                .is_some_and(|f| poll_in(f.as_raw_fd(), Duration::ZERO))
    }

    /// Tells a keeper this daemon started why it exits (the one that
    /// started the daemon reads its exit status instead).
    pub fn say(&self, word: u8) {
        if let Some(l) = &self.link {
            link::say(l, word);
        }
    }

    /// The keeper died (or none runs): starts a new one, handing it the
    /// store in `memfd`, unless keepers died too often. Logs one line.
    pub fn replace(&mut self, cfg: &DeviceConfig, memfd: BorrowedFd<'_>) {
        let id = cfg.id.unwrap_or_default();
        let how = self.reap();
        self.pidfd = None;
        self.link = None;
        if self.deaths.crash(Instant::now()) {
            log::error!(
                "device {id}: its keeper {how} ({} times within {:?}); not starting another: \
                 a crash of this daemon (pid {}) is now fatal to the device",
                policy::GIVE_UP_CRASHES,
                policy::GIVE_UP_WINDOW,
                std::process::id()
            );
            self.needed = false;
            return;
        }
        match start(cfg, memfd) {
            Ok((child, link, pidfd)) => {
                log::warn!(
                    "device {id}: its keeper {how}; started keeper pid {} and handed it the store",
                    child.id()
                );
                self.pid = child.id();
                self.child = Some(child);
                self.link = Some(link);
                self.pidfd = Some(pidfd);
                self.needed = false;
            }
            Err(e) => {
                log::error!(
                    "device {id}: its keeper {how}; cannot start a new one ({e}); retrying"
                );
                self.needed = true;
            }
        }
    }

    /// Reaps a keeper this daemon started; says how the watched one ended.
    fn reap(&mut self) -> String {
        let pid = self.pid;
        let Some(mut c) = self.child.take() else {
            return match self.needed {
                true => format!("(pid {pid}) was gone, or could not be started"),
                false => format!("(pid {pid}) died"),
            };
        };
        match c.wait() {
            Ok(st) => match (st.code(), st.signal()) {
                (Some(code), _) => format!("(pid {pid}) exited with status {code}"),
                (_, Some(sig)) => format!("(pid {pid}) was killed by signal {sig}"),
                _ => format!("(pid {pid}) ended"),
            },
            Err(e) => format!("(pid {pid}) ended ({e})"),
        }
    }
}

/// Whether this process's parent is a zblk keeper (`zblk keeper ...`):
/// a recovering daemon may also be systemd's (`zblk@N.service`).
pub fn parent_is_keeper() -> bool {
    // SAFETY: getppid has no preconditions.
    let ppid = unsafe { libc::getppid() };
    std::fs::read(format!("/proc/{ppid}/cmdline"))
        .is_ok_and(|c| c.split(|&b| b == 0).nth(1) == Some(b"keeper".as_slice()))
}

/// The zblk binary this daemon runs (its path again, if an upgrade
/// replaced the file: the new binary is the one to start).
fn own_exe() -> Result<PathBuf> {
    let exe = std::env::current_exe().map_err(Error::os(Step::SpawnKeeper))?;
    let s = exe.to_string_lossy();
    Ok(match s.strip_suffix(" (deleted)") {
        Some(p) => PathBuf::from(p),
        None => exe,
    })
}

/// A socket pair whose second end a child inherits (no close-on-exec).
fn inheritable_pair() -> Result<(UnixStream, OwnedFd)> {
    let (ours, theirs) = UnixStream::pair().map_err(Error::os(Step::SpawnKeeper))?;
    // SAFETY: fcntl on a descriptor we own; clears close-on-exec only.
    if unsafe { libc::fcntl(theirs.as_raw_fd(), libc::F_SETFD, 0) } < 0 {
        return Err(Error::last_os(Step::SpawnKeeper));
    }
    Ok((ours, OwnedFd::from(theirs)))
}

/// Starts `zblk keeper --adopt` for this daemon, hands it `memfd`, and
/// waits for it to say it is ready.
fn start(cfg: &DeviceConfig, memfd: BorrowedFd<'_>) -> Result<(Child, UnixStream, OwnedFd)> {
    let (ours, theirs) = inheritable_pair()?;
    let mut child = Command::new(own_exe()?)
        .args(adopt_args(cfg, std::process::id(), theirs.as_raw_fd()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        // Its own process group: a signal to the daemon's does not reach it.
        .process_group(0)
        .spawn()
        .map_err(Error::os(Step::SpawnKeeper))?;
    drop(theirs);
    let ready = pidfd_open(child.id()).and_then(|pidfd| {
        fdpass::send_fd(&ours, memfd).map_err(Error::os(Step::SendMemfd))?;
        let said = poll_in(ours.as_raw_fd(), KEEPER_READY).then(|| link::last_word(&ours));
        match said {
            Some(Some(link::READY)) => Ok(pidfd),
            _ => Err(Error::Refused(format!(
                "the new keeper did not take the store within {KEEPER_READY:?}"
            ))),
        }
    });
    match ready {
        Ok(pidfd) => Ok((child, ours, pidfd)),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

/// The arguments of a keeper that adopts daemon `pid` over descriptor
/// `link`.
pub fn adopt_args(cfg: &DeviceConfig, pid: u32, link: RawFd) -> Vec<String> {
    vec![
        "keeper".to_string(),
        "--config-json".to_string(),
        cfg.to_json(),
        "--adopt".to_string(),
        pid.to_string(),
        "--link-fd".to_string(),
        link.to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_harness_is_no_keeper() {
        assert!(!parent_is_keeper());
    }

    #[test]
    fn adopt_arguments_name_the_daemon_and_the_link() {
        let cfg = DeviceConfig::from_flags(["-s", "1G", "-n", "3"]).unwrap();
        let a = adopt_args(&cfg, 42, 5);
        assert_eq!(a[0], "keeper");
        assert_eq!(DeviceConfig::from_json(&a[2]).unwrap(), cfg);
        assert_eq!(&a[3..], ["--adopt", "42", "--link-fd", "5"]);
    }

    #[test]
    fn a_dead_keeper_is_seen_and_given_up_on_after_too_many_deaths() {
        // A stand-in "keeper": a child that exits at once.
        let c = Command::new("/bin/true").spawn().unwrap();
        let mut w = KeeperWatch {
            pid: c.id(),
            pidfd: Some(pidfd_open(c.id()).unwrap()),
            child: Some(c),
            link: None,
            deaths: CrashWindow::new(1, Duration::from_secs(60)),
            needed: false,
        };
        let t0 = Instant::now();
        while !w.needs_keeper() {
            assert!(t0.elapsed() < Duration::from_secs(10), "exit not seen");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(w.reap().ends_with("exited with status 0"));
        // One death allowed in the window: the next is given up on, with
        // nothing started (no binary is needed for that).
        let cfg = DeviceConfig::from_flags(["-s", "1M", "-n", "0"]).unwrap();
        let f = tempfile_fd();
        w.replace(&cfg, f.as_fd());
        assert!(!w.needs_keeper() && w.fd() == -1 && w.child.is_none());
    }

    fn tempfile_fd() -> std::fs::File {
        tempfile::tempfile().unwrap()
    }

    use std::os::fd::AsFd;
}
