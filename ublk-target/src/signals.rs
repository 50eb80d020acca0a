//! SIGTERM and SIGINT, received through a signalfd that the control loop
//! polls rather than by a handler.

use crate::error::{Error, Result, Step};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The stop signals, blocked and readable from a descriptor.
pub struct StopSignals(OwnedFd);

impl StopSignals {
    /// Blocks SIGTERM and SIGINT in this thread (and the threads it will
    /// create) and opens a non-blocking signalfd that receives them.
    pub fn block() -> Result<Self> {
        // SAFETY: sigset_t is plain data, valid when zeroed; sigemptyset
        // and sigaddset only write to the local set.
        let set = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            set
        };
        // SAFETY: a valid set, and a null old-set pointer (not asked for).
        let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if r != 0 {
            return Err(Error::Os {
                step: Step::BlockSignals,
                source: std::io::Error::from_raw_os_error(r),
            });
        }
        // SAFETY: -1 asks for a new descriptor; `set` is valid.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
        if fd < 0 {
            return Err(Error::last_os(Step::Signalfd));
        }
        // SAFETY: fd is a fresh descriptor owned by nobody else.
        Ok(StopSignals(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The descriptor to poll.
    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// The number of a pending signal, if one is there.
    pub fn read(&self) -> Option<u32> {
        // SAFETY: signalfd_siginfo is plain data, valid when zeroed.
        let mut si: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let sz = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: reading at most `sz` bytes into the local `si`, which is
        // exactly that big.
        let n = unsafe {
            libc::read(
                self.fd(),
                (&mut si as *mut libc::signalfd_siginfo).cast(),
                sz,
            )
        };
        (usize::try_from(n) == Ok(sz)).then_some(si.ssi_signo)
    }
}
