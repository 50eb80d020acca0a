//! Telling systemd that a device serves I/O (`Type=notify` units,
//! `dist/systemd/zblk@.service`), through the `sd-notify` crate.
//!
//! It also keeps a device's store across a crash of a daemon that systemd
//! supervises: the store's memfd goes into the service's file-descriptor
//! store (`FDSTORE=1`, `FDNAME=store`; the unit says
//! `FileDescriptorStoreMax=1`), and systemd hands it to the next daemon
//! it starts (`LISTEN_FDS`/`LISTEN_FDNAMES`), which recovers the device
//! from it as it would from a keeper's.
//!
//! Outside a notify service `NOTIFY_SOCKET` is unset and every call here is
//! a no-op. `NOTIFY_SOCKET` is left in the environment: the calls come from
//! a thread while the queue threads run, and changing the environment then
//! is not sound; children that inherit it (mkswap) do not notify.

use sd_notify::NotifyState;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};

/// The name of the store's memfd in systemd's file-descriptor store.
pub const STORE_FDNAME: &str = "store";

/// Sends `READY=1` with `STATUS=<status>`: the service is up.
///
/// A failure to reach the socket is returned for the caller to log; it
/// does not stop the device (systemd then times the start out and says so).
pub fn ready(status: &str) -> std::io::Result<()> {
    sd_notify::notify(false, &[NotifyState::Ready, NotifyState::Status(status)])
}

/// Whether a service manager can keep the store's memfd for us: we run
/// under `NOTIFY_SOCKET`, and the manager did not say that its store
/// holds nothing (systemd 254+ sets `FDSTORE` to the unit's
/// `FileDescriptorStoreMax=`; older ones say nothing, and the unit we ship
/// asks for one).
pub fn fd_store_offered() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
        && std::env::var("FDSTORE").map_or(true, |n| n.trim() != "0")
}

/// Puts `fd` into the service's file-descriptor store as
/// [`STORE_FDNAME`]. systemd keeps it across restarts of the unit and
/// closes it when the unit stops for good.
pub fn store_fd(fd: &impl AsFd) -> std::io::Result<()> {
    let states = [NotifyState::FdStore, NotifyState::FdName(STORE_FDNAME)];
    sd_notify::notify_with_fds(false, &states, &[fd.as_fd()])
}

/// Takes the store's memfd that systemd passed to this process, if any;
/// every other descriptor it passed is closed. Reads and clears the
/// `LISTEN_*` variables, so it must run before any thread starts.
pub fn take_stored_fd() -> std::io::Result<Option<OwnedFd>> {
    // Variables inherited from a parent that systemd started are not ours
    // (the crate would then count no descriptors but two names, an error).
    let ours = std::env::var("LISTEN_PID").is_ok_and(|p| p == std::process::id().to_string());
    if !ours {
        return Ok(None);
    }
    let mut store = None;
    for (raw, name) in sd_notify::listen_fds_with_names(true)? {
        // SAFETY: systemd passed `raw` to this process alone (LISTEN_PID is
        // ours, checked by listen_fds_with_names) and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if name == STORE_FDNAME && store.is_none() {
            store = Some(fd);
        }
    }
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;
    use std::time::Duration;

    /// The only test of this crate that sets `NOTIFY_SOCKET`.
    #[test]
    fn ready_reaches_the_notify_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        std::env::set_var("NOTIFY_SOCKET", &path);
        ready("serving /dev/ublkb3").unwrap();
        let mut buf = [0u8; 256];
        let n = sock.recv(&mut buf).unwrap();
        let msg = std::str::from_utf8(&buf[..n]).unwrap();
        assert_eq!(msg, "READY=1\nSTATUS=serving /dev/ublkb3\n");
        // The store's memfd, with its name.
        let memfd = tempfile::tempfile().unwrap();
        store_fd(&memfd).unwrap();
        let (n, fds) = recv_with_fds(&sock, &mut buf);
        assert_eq!(&buf[..n], b"FDSTORE=1\nFDNAME=store\n");
        assert_eq!(fds, 1, "one descriptor passed");
        assert!(fd_store_offered());
        std::env::set_var("FDSTORE", "0");
        assert!(!fd_store_offered(), "FDSTORE=0: the unit keeps nothing");
        std::env::remove_var("FDSTORE");
        std::env::remove_var("NOTIFY_SOCKET");
        assert!(!fd_store_offered());
        // Without a socket there is nobody to tell, and no error.
        ready("x").unwrap();
        store_fd(&memfd).unwrap();
    }

    /// Receives one datagram into `buf`; returns its length and how many
    /// descriptors came with it (closing them).
    fn recv_with_fds(sock: &UnixDatagram, buf: &mut [u8]) -> (usize, usize) {
        use sendfd::RecvWithFd;
        let mut fds = [0; 4];
        let (n, nfds) = sock.recv_with_fd(buf, &mut fds).unwrap();
        for fd in &fds[..nfds] {
            // SAFETY: the descriptor was just received and is ours alone.
            drop(unsafe { OwnedFd::from_raw_fd(*fd) });
        }
        (n, nfds)
    }

    /// A descriptor named `store` is taken, the others are closed, and
    /// the variables are cleared; LISTEN_PID of another process is not
    /// for us. Runs in a child process: it sets LISTEN_* and closes fds.
    #[test]
    fn the_stored_fd_is_found_by_name() {
        // SAFETY: fork in a test; the child only calls async-signal-safe
        // work plus plain Rust that allocates nothing shared, then _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = std::panic::catch_unwind(child_takes_store).map_or(1, |ok| i32::from(!ok));
            // SAFETY: leaves the forked child without running the parent's
            // destructors or test harness.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }

    fn child_takes_store() -> bool {
        use std::os::fd::IntoRawFd;
        for target in [3, 4] {
            let raw = tempfile::tempfile().unwrap().into_raw_fd();
            if raw != target {
                // SAFETY: in the forked child, put the file at the number
                // systemd would use and close the original (ours alone).
                unsafe {
                    libc::dup2(raw, target);
                    libc::close(raw);
                }
            }
        }
        std::env::set_var("LISTEN_PID", (std::process::id() + 1).to_string());
        std::env::set_var("LISTEN_FDS", "2");
        std::env::set_var("LISTEN_FDNAMES", "other:store");
        let not_ours = take_stored_fd().unwrap().is_none();
        std::env::set_var("LISTEN_PID", std::process::id().to_string());
        std::env::set_var("LISTEN_FDS", "2");
        std::env::set_var("LISTEN_FDNAMES", "other:store");
        let got = take_stored_fd().unwrap();
        let raw = got.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        // SAFETY: fcntl on a descriptor number only reads its flags.
        let other_closed = unsafe { libc::fcntl(3, libc::F_GETFD) } < 0;
        let cleared = std::env::var_os("LISTEN_FDS").is_none()
            && std::env::var_os("LISTEN_FDNAMES").is_none();
        not_ours && raw == Some(4) && other_closed && cleared
    }
}
