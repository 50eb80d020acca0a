//! Telling systemd that a device serves I/O (`Type=notify` units,
//! `dist/systemd/zblk@.service`), through the `sd-notify` crate.
//!
//! Outside a notify service `NOTIFY_SOCKET` is unset and every call here is
//! a no-op. `NOTIFY_SOCKET` is left in the environment: the calls come from
//! a thread while the queue threads run, and changing the environment then
//! is not sound; children that inherit it (mkswap) do not notify.

use sd_notify::NotifyState;

/// Sends `READY=1` with `STATUS=<status>`: the service is up.
///
/// A failure to reach the socket is returned for the caller to log; it
/// does not stop the device (systemd then times the start out and says so).
pub fn ready(status: &str) -> std::io::Result<()> {
    sd_notify::notify(false, &[NotifyState::Ready, NotifyState::Status(status)])
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
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 256];
        let n = sock.recv(&mut buf).unwrap();
        let msg = std::str::from_utf8(&buf[..n]).unwrap();
        assert_eq!(msg, "READY=1\nSTATUS=serving /dev/ublkb3\n");
        // Without a socket there is nobody to tell, and no error.
        ready("x").unwrap();
    }
}
