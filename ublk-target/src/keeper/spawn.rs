//! Starting a daemon from the keeper, watching it through a pidfd, and
//! reading its readiness line.

use super::ready;
use crate::config::DeviceConfig;
use crate::control::DeviceInfo;
use crate::error::{Error, Result, Step};
use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

/// A running daemon: a pidfd that polls readable when it exits, and how
/// to learn why it did.
pub struct Daemon {
    /// Its process id.
    pub pid: u32,
    /// The process, when this keeper started it: its exit status says why
    /// it ended.
    pub child: Option<Child>,
    /// `pidfd_open` of it.
    pub pidfd: OwnedFd,
    /// The link to a daemon that started this keeper (it is not our
    /// child): its last word says why it ended ([`super::link`]).
    pub link: Option<UnixStream>,
}

impl Daemon {
    /// The daemon `pid` that started this keeper, over `link`.
    pub fn adopt(pid: u32, link: UnixStream) -> Result<Daemon> {
        Ok(Daemon {
            pid,
            child: None,
            pidfd: pidfd_open(pid)?,
            link: Some(link),
        })
    }

    /// Kills and reaps a daemon this keeper started (one it adopted is
    /// its parent: left alone).
    pub fn kill(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The arguments of the first daemon: a new device, whose memfd comes back
/// on descriptor `keeper_fd`.
pub fn fresh_args(cfg: &DeviceConfig, keeper_fd: RawFd, log_file: Option<&Path>) -> Vec<String> {
    let mut a = vec![
        "daemon".to_string(),
        "--config-json".to_string(),
        cfg.to_json(),
        "--keeper-fd".to_string(),
        keeper_fd.to_string(),
    ];
    if let Some(p) = log_file {
        a.extend(["--log-file".to_string(), p.display().to_string()]);
    }
    a
}

/// The arguments of a recovering daemon: device `cfg.id` with its store
/// in descriptor `memfd`.
pub fn recover_args(cfg: &DeviceConfig, memfd: RawFd) -> Vec<String> {
    vec![
        "recover".to_string(),
        "-n".to_string(),
        cfg.id.unwrap_or_default().to_string(),
        "--memfd".to_string(),
        memfd.to_string(),
        "--config-json".to_string(),
        cfg.to_json(),
    ]
}

/// Starts `exe args` with descriptor `keep` inherited (the others are
/// close-on-exec), stdout piped to us, stderr shared (the device's log).
pub fn spawn(exe: &Path, args: &[String], keep: RawFd) -> Result<(Daemon, ChildStdout)> {
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // SAFETY: fcntl is async-signal-safe; it clears close-on-exec of one
    // descriptor in the child only.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(keep, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(Error::os(Step::SpawnDaemon))?;
    let pidfd = pidfd_open(child.id()).inspect_err(|_| {
        let _ = child.kill();
    })?;
    let out = child
        .stdout
        .take()
        .ok_or(Error::Refused("the daemon has no stdout".into()))?;
    let d = Daemon {
        pid: child.id(),
        child: Some(child),
        pidfd,
        link: None,
    };
    Ok((d, out))
}

/// `pidfd_open(pid)` (Linux 5.3).
pub fn pidfd_open(pid: u32) -> Result<OwnedFd> {
    // SAFETY: the syscall takes two integers and returns a descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(Error::last_os(Step::WatchDaemon));
    }
    // SAFETY: a fresh descriptor, owned by nobody else (close-on-exec by
    // the kernel's default for pidfds).
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Waits up to `timeout` for the readiness line on `out`: the device, or
/// why not.
pub fn read_ready(out: ChildStdout, timeout: Duration) -> Result<DeviceInfo> {
    if !poll_in(out.as_raw_fd(), timeout) {
        return Err(Error::Refused(format!(
            "the daemon did not bring the device up within {timeout:?}"
        )));
    }
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .map_err(Error::os(Step::DaemonReady))?;
    if line.trim().is_empty() {
        return Err(Error::Refused(
            "the daemon exited before the device was ready".into(),
        ));
    }
    ready::parse(&line).map_err(Error::Refused)
}

/// Whether `fd` polls readable (or hung up) within `timeout`.
pub fn poll_in(fd: RawFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    loop {
        // SAFETY: one valid, writable pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return n > 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_name_the_inherited_descriptor() {
        let cfg = DeviceConfig::from_flags(["-s", "1G", "-n", "3"]).unwrap();
        let a = recover_args(&cfg, 7);
        assert_eq!(&a[..5], ["recover", "-n", "3", "--memfd", "7"]);
        assert_eq!(DeviceConfig::from_json(&a[6]).unwrap(), cfg);
        let a = fresh_args(&cfg, 4, Some(Path::new("/run/zblk/x.log")));
        assert_eq!(a[0], "daemon");
        assert_eq!(
            &a[3..],
            ["--keeper-fd", "4", "--log-file", "/run/zblk/x.log"]
        );
    }

    #[test]
    fn a_child_is_watched_and_its_line_read() {
        let (d, out) = spawn(
            Path::new("/bin/sh"),
            &[
                "-c".into(),
                "echo '{\"ok\":false,\"error\":\"no way\"}'".into(),
            ],
            0,
        )
        .unwrap();
        let e = read_ready(out, Duration::from_secs(10)).unwrap_err();
        assert_eq!(e.to_string(), "no way");
        assert!(poll_in(d.pidfd.as_raw_fd(), Duration::from_secs(10)));
        let mut child = d.child.unwrap();
        assert!(child.wait().unwrap().success());
    }
}
