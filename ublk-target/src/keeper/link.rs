//! The link between a daemon and a keeper the daemon started (after its
//! own keeper died, see [`super::replace`]): a socket pair the keeper
//! inherits. The daemon sends the store's memfd on it (`SCM_RIGHTS`), the
//! keeper answers [`READY`] once it holds it and listens on its socket,
//! and the daemon says [`DELETED`] or [`HANDOVER`] just before a clean
//! exit. The keeper is not the daemon's parent there, so it cannot read
//! the daemon's exit status: a daemon that died with nothing said crashed.

use std::io::Read;
use std::os::unix::net::UnixStream;

/// Keeper to daemon: the store is held, the keeper socket bound.
pub const READY: u8 = b'R';
/// Daemon to keeper: the device was deleted; the keeper leaves.
pub const DELETED: u8 = b'D';
/// Daemon to keeper: handed over (`zblk restart`); start the next daemon.
pub const HANDOVER: u8 = b'H';

/// What a daemon said before it went, if anything (read without waiting:
/// the daemon has exited, so its word is there or never will be).
pub fn last_word(link: &UnixStream) -> Option<u8> {
    link.set_nonblocking(true).ok()?;
    let mut b = [0u8];
    match (&*link).read(&mut b) {
        Ok(1) => Some(b[0]),
        _ => None,
    }
}

/// Says `word` on `link`, ignoring a keeper that is gone (it has nothing
/// to act on then).
pub fn say(link: &UnixStream, word: u8) {
    use std::io::Write;
    if let Err(e) = (&*link).write_all(&[word]) {
        log::warn!("cannot tell the keeper: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_last_word_or_none() {
        let (a, b) = UnixStream::pair().unwrap();
        assert_eq!(last_word(&b), None, "nothing said yet, no wait");
        say(&a, HANDOVER);
        assert_eq!(last_word(&b), Some(HANDOVER));
        say(&a, DELETED);
        drop(a);
        assert_eq!(last_word(&b), Some(DELETED));
        assert_eq!(last_word(&b), None, "closed with nothing more said");
    }
}
