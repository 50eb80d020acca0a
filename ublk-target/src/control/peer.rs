//! Who is on the other end of a control connection, and the refusal of
//! anyone but root.
//!
//! The sockets are root's already by their file mode (0600 in the 0700
//! `/run/zblk`), so a non-root process cannot even connect. The daemon and
//! the keeper check the peer's credentials (`SO_PEERCRED`, taken by the
//! kernel at `connect`) on every connection as well, before reading the
//! request: a socket whose mode was loosened, a descriptor passed to
//! another process, or a run directory made by hand still answer root only,
//! with one clear line, for every command, statistics included.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// The credentials of the process that connected `s` (`SO_PEERCRED`).
pub fn peer_uid(s: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a live
    // ucred of exactly that size, and updates `len`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Why a peer with `uid` (or whose credentials could not be read) is not
/// served; `None` for root.
pub fn refusal(uid: std::io::Result<u32>) -> Option<String> {
    match uid {
        Ok(0) => None,
        Ok(uid) => Some(format!(
            "permission denied: zblk's control socket answers root only (you are uid {uid})"
        )),
        Err(e) => Some(format!(
            "permission denied: cannot read the client's credentials: {e}"
        )),
    }
}

/// The refusal for the peer of `s`, if it is not root.
pub fn check(s: &UnixStream) -> Option<String> {
    refusal(peer_uid(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_is_served() {
        assert_eq!(refusal(Ok(0)), None);
        assert_eq!(
            refusal(Ok(65534)).unwrap(),
            "permission denied: zblk's control socket answers root only (you are uid 65534)"
        );
        let e = std::io::Error::from_raw_os_error(libc::ENOTSOCK);
        assert!(refusal(Err(e))
            .unwrap()
            .starts_with("permission denied: cannot read"));
    }

    #[test]
    fn a_socket_pair_names_this_process() {
        let (a, _b) = UnixStream::pair().unwrap();
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert_eq!(peer_uid(&a).unwrap(), me);
    }
}
