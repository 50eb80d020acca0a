//! Why the daemon failed: which step, and its cause, worded once.
//!
//! [`Error`]'s `Display` is the one line `zblk` prints on stderr; the
//! cause stays available (`source()`, or by matching) for callers that
//! act on it.

use std::fmt;
use std::path::PathBuf;

/// A step of bringing a device up, serving it or deleting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Making the daemon an I/O flusher (`prctl(PR_SET_IO_FLUSHER)`).
    IoFlusher,
    /// Setting `oom_score_adj`.
    OomScore,
    /// Locking the daemon's memory (`mlockall`).
    LockMemory,
    /// Dropping the capabilities a started daemon or keeper does not need.
    DropCapabilities,
    /// Setting `no_new_privs`.
    NoNewPrivs,
    /// Blocking SIGTERM and SIGINT.
    BlockSignals,
    /// Opening the signalfd.
    Signalfd,
    /// Opening a queue's eventfd.
    Eventfd,
    /// Creating the run directory.
    RunDir,
    /// Binding the control socket.
    Bind(PathBuf),
    /// Restricting the control socket to root.
    Chmod(PathBuf),
    /// Making the control socket non-blocking.
    Nonblocking(PathBuf),
    /// Adding the ublk device.
    CreateDevice,
    /// Starting the device's queues and disk.
    StartDevice(u32),
    /// Opening the ublk control of an existing device.
    OpenDevice(u32),
    /// Deleting a device.
    DeleteDevice(u32),
    /// Removing a control socket.
    RemoveSocket(PathBuf),
    /// Enabling swap on a device.
    SwapOn(PathBuf),
    /// Disabling swap on a device.
    SwapOff(PathBuf),
    /// Taking over a device whose daemon died (`START_USER_RECOVERY`).
    StartRecovery(u32),
    /// Handing the store's memfd to the keeper.
    SendMemfd,
    /// Receiving the store's memfd.
    ReceiveMemfd,
    /// Starting a daemon from the keeper.
    SpawnDaemon,
    /// Starting a keeper from the daemon (its keeper died).
    SpawnKeeper,
    /// Reading a daemon's readiness line.
    DaemonReady,
    /// Watching the daemon (`pidfd_open`, `waitpid`).
    WatchDaemon,
    /// Talking to the keeper of a device.
    Keeper(u32),
}

impl Step {
    /// What to try, said after the cause.
    fn hint(&self) -> &'static str {
        match self {
            Step::IoFlusher => " (needs CAP_SYS_RESOURCE)",
            Step::LockMemory => " (needs CAP_IPC_LOCK or a large RLIMIT_MEMLOCK)",
            _ => "",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::IoFlusher => write!(f, "prctl(PR_SET_IO_FLUSHER) failed"),
            Step::OomScore => write!(f, "cannot set oom_score_adj to -1000"),
            Step::LockMemory => write!(f, "mlockall failed"),
            Step::DropCapabilities => write!(f, "cannot drop capabilities"),
            Step::NoNewPrivs => write!(f, "prctl(PR_SET_NO_NEW_PRIVS) failed"),
            Step::BlockSignals => write!(f, "pthread_sigmask failed"),
            Step::Signalfd => write!(f, "signalfd"),
            Step::Eventfd => write!(f, "eventfd"),
            Step::RunDir => write!(f, "cannot create {}", crate::paths::RUN_DIR),
            Step::Bind(p) => write!(f, "cannot bind {}", p.display()),
            Step::Chmod(p) => write!(f, "chmod {}", p.display()),
            Step::Nonblocking(p) => write!(f, "{}", p.display()),
            Step::CreateDevice => write!(f, "cannot create the ublk device"),
            Step::StartDevice(id) => write!(f, "device {id} failed to start"),
            Step::OpenDevice(id) => write!(f, "device {id}"),
            Step::DeleteDevice(id) => write!(f, "cannot delete device {id}"),
            Step::RemoveSocket(p) => write!(f, "cannot remove {}", p.display()),
            Step::SwapOn(p) => write!(f, "swapon {}", p.display()),
            Step::SwapOff(p) => write!(f, "swapoff {}", p.display()),
            Step::StartRecovery(id) => write!(f, "cannot take over device {id}"),
            Step::SendMemfd => write!(
                f,
                "cannot hand the store's memfd to its keeper (or systemd's fd store)"
            ),
            Step::ReceiveMemfd => write!(f, "cannot receive the store's memfd"),
            Step::SpawnDaemon => write!(f, "cannot start the daemon"),
            Step::SpawnKeeper => write!(f, "cannot start a keeper"),
            Step::DaemonReady => write!(f, "the daemon did not say it was ready"),
            Step::WatchDaemon => write!(f, "cannot watch the daemon"),
            Step::Keeper(id) => write!(f, "keeper of device {id}"),
        }
    }
}

/// A daemon failure.
#[derive(Debug)]
pub enum Error {
    /// A system call of `step` failed.
    Os {
        /// What was being done.
        step: Step,
        /// The system's answer.
        source: std::io::Error,
    },
    /// libublk or the ublk driver refused `step`.
    Ublk {
        /// What was being done.
        step: Step,
        /// libublk's answer.
        source: libublk::UblkError,
    },
    /// The engine refused the configuration.
    Engine(zblk::Error),
    /// Device `id` has no zblk control socket, so it is not zblk's.
    NotZblk(u32),
    /// A device id no ublk device can have.
    IdOutOfRange(u32),
    /// The device is active swap and stopping it was not forced.
    ActiveSwap(PathBuf),
    /// A device path holds a NUL byte.
    NulInPath(PathBuf),
    /// A daemon or keeper said no, in its own words.
    Refused(String),
}

/// What daemon functions return.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// `step` failed with the calling thread's last OS error.
    pub fn last_os(step: Step) -> Error {
        Error::Os {
            step,
            source: std::io::Error::last_os_error(),
        }
    }

    /// A mapper for `map_err`: `step` failed with this I/O error.
    pub fn os(step: Step) -> impl FnOnce(std::io::Error) -> Error {
        move |source| Error::Os { step, source }
    }

    /// A mapper for `map_err`: libublk refused `step`.
    pub fn ublk(step: Step) -> impl FnOnce(libublk::UblkError) -> Error {
        move |source| Error::Ublk { step, source }
    }

    /// The errno behind the failure, when there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Os { source, .. } => source.raw_os_error(),
            Error::Ublk {
                source: libublk::UblkError::OtherError(e) | libublk::UblkError::UringIOError(e),
                ..
            } => Some(e.saturating_neg()),
            Error::Ublk {
                source: libublk::UblkError::IOError(e),
                ..
            } => e.raw_os_error(),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Os { step, source } => write!(f, "{step}: {source}{}", step.hint()),
            Error::Ublk { step, source } => write!(f, "{step}: {}", UblkCause(source)),
            Error::Engine(e) => write!(f, "{e}"),
            Error::NotZblk(id) => write!(f, "device {id} has no zblk socket: not deleting it"),
            Error::IdOutOfRange(id) => write!(f, "device id {id} is out of range"),
            Error::ActiveSwap(p) => write!(
                f,
                "{} is active swap: swapoff it first (or zblk del --force)",
                p.display()
            ),
            Error::NulInPath(p) => write!(f, "{} contains a NUL byte", p.display()),
            Error::Refused(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Os { source, .. } => Some(source),
            Error::Ublk { source, .. } => Some(source),
            Error::Engine(e) => Some(e),
            _ => None,
        }
    }
}

impl From<zblk::Error> for Error {
    fn from(e: zblk::Error) -> Self {
        Error::Engine(e)
    }
}

/// A libublk error in words: the errno, and what it usually means when
/// creating a device.
pub struct UblkCause<'a>(pub &'a libublk::UblkError);

impl fmt::Display for UblkCause<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use libublk::UblkError;
        match self.0 {
            UblkError::OtherError(errno) | UblkError::UringIOError(errno) => {
                let what = std::io::Error::from_raw_os_error(errno.saturating_neg());
                match errno.saturating_neg() {
                    libc::EPERM => {
                        write!(f, "{what} (mlock of the I/O buffers failed, or not root)")
                    }
                    libc::EEXIST => write!(f, "{what} (that device id is taken)"),
                    _ => write!(f, "{what}"),
                }
            }
            UblkError::IOError(e) => write!(f, "{e}"),
            other => write!(f, "{other}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_say_the_step_the_cause_and_the_hint() {
        let e = Error::Os {
            step: Step::LockMemory,
            source: std::io::Error::from_raw_os_error(libc::EPERM),
        };
        let s = e.to_string();
        assert!(
            s.starts_with("mlockall failed: Operation not permitted"),
            "{s}"
        );
        assert!(
            s.ends_with("(needs CAP_IPC_LOCK or a large RLIMIT_MEMLOCK)"),
            "{s}"
        );
        assert_eq!(e.errno(), Some(libc::EPERM));
        assert!(std::error::Error::source(&e).is_some());

        let e = Error::Ublk {
            step: Step::CreateDevice,
            source: libublk::UblkError::OtherError(-libc::EEXIST),
        };
        assert_eq!(
            e.to_string(),
            "cannot create the ublk device: File exists (os error 17) (that device id is taken)"
        );
        assert_eq!(e.errno(), Some(libc::EEXIST));
        assert_eq!(
            Error::NotZblk(4).to_string(),
            "device 4 has no zblk socket: not deleting it"
        );
    }
}
