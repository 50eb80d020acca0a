//! The terminal side of `zblk top`: keys without Enter, Ctrl-C and SIGTERM
//! as a clean stop, and the terminal given back as it was on every way out.
//!
//! Only canonical mode and echo are turned off (not full raw mode): Ctrl-C
//! still makes SIGINT, output still turns `\n` into CR LF. SIGINT and
//! SIGTERM are blocked and read from a signalfd, so no handler runs and the
//! loop ends normally, running [`Drop`]; a panic unwinds through it too.

use super::base::CliError;
use std::io::IsTerminal;
use std::time::Duration;
use zblk_ublk::signals::StopSignals;

/// What ended a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The time was up.
    Timeout,
    /// `q` was pressed, or SIGINT / SIGTERM came: stop.
    Quit,
}

/// The terminal while `zblk top` runs.
pub struct Term {
    signals: StopSignals,
    /// The settings to restore, when stdin is a terminal we changed.
    saved: Option<libc::termios>,
}

impl Term {
    /// Blocks the stop signals (before any thread starts, so that every
    /// thread inherits the mask) and, when stdin is a terminal, turns off
    /// canonical mode and echo so that `q` needs no Enter.
    pub fn open() -> Result<Term, CliError> {
        let signals = StopSignals::block().map_err(|e| CliError(e.to_string()))?;
        let saved = match std::io::stdin().is_terminal() {
            true => Some(keys_without_enter()?),
            false => None,
        };
        Ok(Term { signals, saved })
    }

    /// Waits up to `d` for `q` or a stop signal.
    pub fn wait(&self, d: Duration) -> Wake {
        let mut fds = vec![pollfd(self.signals.fd())];
        if self.saved.is_some() {
            fds.push(pollfd(libc::STDIN_FILENO));
        }
        let ms = i32::try_from(d.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n <= 0 {
            // Timeout, or EINTR (a signal we do not stop on): a refresh.
            return Wake::Timeout;
        }
        if fds[0].revents != 0 && self.signals.read().is_some() {
            return Wake::Quit;
        }
        match fds.get(1) {
            Some(f) if f.revents != 0 && read_quit_key() => Wake::Quit,
            _ => Wake::Timeout,
        }
    }
}

impl Drop for Term {
    fn drop(&mut self) {
        if let Some(t) = &self.saved {
            // SAFETY: `t` is a termios tcgetattr filled for this descriptor.
            unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, t) };
        }
    }
}

fn pollfd(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Turns off canonical mode and echo on stdin; returns the old settings.
fn keys_without_enter() -> Result<libc::termios, CliError> {
    // SAFETY: termios is plain data, valid when zeroed; tcgetattr fills it.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: stdin is open; `t` is a valid termios to write into.
    if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut t) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(CliError(format!(
            "cannot read the terminal's settings: {e}"
        )));
    }
    let mut keys = t;
    keys.c_lflag &= !(libc::ICANON | libc::ECHO);
    keys.c_cc[libc::VMIN] = 1;
    keys.c_cc[libc::VTIME] = 0;
    // SAFETY: stdin is open; `keys` is a valid termios.
    if unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &keys) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(CliError(format!("cannot set the terminal up: {e}")));
    }
    Ok(t)
}

/// Reads the keys waiting on stdin: true when one is `q` (or stdin ended).
fn read_quit_key() -> bool {
    let mut buf = [0u8; 64];
    // SAFETY: reading at most `buf.len()` bytes into the local buffer.
    let n = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
    match usize::try_from(n) {
        Ok(0) => true,
        Ok(n) => is_quit(&buf[..n]),
        Err(_) => false,
    }
}

/// Whether the keys typed include `q` or `Q`.
fn is_quit(keys: &[u8]) -> bool {
    keys.iter().any(|k| matches!(k, b'q' | b'Q'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q_in_any_case_quits_other_keys_do_not() {
        assert!(is_quit(b"q"));
        assert!(is_quit(b"abQ"));
        assert!(!is_quit(b"x \n"));
        assert!(!is_quit(b""));
    }
}
