//! The keeper: a small process that outlives the daemon of one device,
//! holds the memfd its store lives in, and starts a new daemon that takes
//! the device over when the old one dies.
//!
//! `zblk add` starts the keeper; the keeper starts the first daemon. The
//! daemon creates the store in shared memory and hands its memfd to the
//! keeper over an inherited socket pair with `SCM_RIGHTS`, before it
//! creates the device (the engine makes the memfd, so the daemon is the one
//! that has it first; passing it up keeps the engine's own creation path
//! the only one). From then on the keeper does nothing but wait on a pidfd
//! of its daemon and on its socket (`/run/zblk/<id>.keeper.sock`):
//!
//! - the daemon exits 0: the device was deleted (`zblk del`); the keeper
//!   exits too;
//! - it exits with [`EXIT_HANDOVER`] (`zblk restart`): a new daemon is
//!   started at once, not counted as a crash;
//! - anything else (killed, panicked, failed) is a crash: a new daemon is
//!   started with the memfd inherited (`zblk recover -n ID --memfd FD`),
//!   which recovers the store (`Store::recover`) and the device
//!   (`START_USER_RECOVERY` .. `END_USER_RECOVERY`); the driver held the
//!   I/O meanwhile and reissues what was in flight.
//!
//! **Why a keeper that executes the binary again, not a standby daemon.**
//! A standby would hold a second set of mlocked I/O buffers (queues x
//! depth x up to 2 MB) and its own heap for as long as the device lives.
//! The keeper holds only its own few hundred KB, mlocked, with
//! `oom_score_adj` -1000; the new daemon's buffers replace the dead one's,
//! which its death has just given back, so a restart needs about the memory
//! that was freed, not more; the store itself is not copied (it stays in
//! the memfd). The keeper's `mlockall` also keeps the zblk binary's pages
//! resident (it maps the same file), so starting the new daemon reads
//! nothing from disk. While no daemon maps the store, the keeper locks its
//! pages itself ([`pin`]), so that reclaim cannot swap them out onto the
//! very device that waits for them.
//!
//! **A keeper that dies is replaced.** The daemon watches its keeper and,
//! when it dies, starts a new one and hands it the memfd ([`replace`]),
//! which watches the daemon through the link between them ([`link`]).
//!
//! **Giving up.** A daemon that crashes on the same request would crash
//! again and again with the I/O stalled: after [`policy::GIVE_UP_CRASHES`]
//! crashes within [`policy::GIVE_UP_WINDOW`] the keeper logs one line,
//! stops and deletes the device (the driver fails the held I/O: nothing
//! hangs) and exits. `UBLK_F_USER_RECOVERY_FAIL_IO` is not used: it is a
//! mode chosen at creation that fails every request while no daemon runs,
//! the opposite of what REISSUE gives a swap device on every crash.

pub mod link;
mod pin;
pub mod policy;
pub mod ready;
pub mod replace;
mod run;
mod spawn;

pub use replace::KeeperWatch;
pub use run::{run, Adopt, KeeperConfig};

use crate::control::client::{request_at, ClientError};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Exit status of a daemon that handed its device over (`zblk restart`).
pub const EXIT_HANDOVER: i32 = 75;

/// What a client asks of a keeper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum KeeperRequest {
    /// Its state: [`KeeperStatus`].
    Status,
    /// Has the daemon hand over and starts a new one (possibly a new
    /// binary at the same path): `{"pid": P, "ms": T}`.
    Restart,
    /// Starts a recovering daemon now unless one serves the device.
    Recover,
}

/// What a keeper says about its device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeeperStatus {
    /// `live` (a daemon serves the device), `recovering` (a daemon is
    /// starting), or with no daemon the driver's state
    /// ([`crate::device::driver_state`]: `quiesced`, `fail-io`, `dead`).
    pub state: String,
    /// The keeper's process id.
    pub keeper_pid: u32,
    /// The daemon's process id (0: none right now).
    pub daemon_pid: u32,
    /// Daemons started after a crash.
    pub recoveries: u64,
    /// Daemons started by `zblk restart`.
    pub restarts: u64,
    /// Crashes within the give-up window now.
    pub recent_crashes: usize,
}

/// Sends `req` to the keeper of device `id`.
pub fn request(
    id: u32,
    req: &KeeperRequest,
    timeout: Duration,
) -> Result<serde_json::Value, ClientError> {
    request_at(&crate::paths::keeper_socket_path(id), id, req, timeout)
}

/// The keeper's status, if a keeper runs for device `id`.
pub fn status(id: u32) -> Option<KeeperStatus> {
    let v = request(id, &KeeperRequest::Status, Duration::from_secs(2)).ok()?;
    serde_json::from_value(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeper_requests_have_a_stable_wire_form() {
        for (req, wire) in [
            (KeeperRequest::Status, r#"{"cmd":"status"}"#),
            (KeeperRequest::Restart, r#"{"cmd":"restart"}"#),
            (KeeperRequest::Recover, r#"{"cmd":"recover"}"#),
        ] {
            assert_eq!(serde_json::to_string(&req).unwrap(), wire);
            assert_eq!(serde_json::from_str::<KeeperRequest>(wire).unwrap(), req);
        }
        assert!(status(4_000_000).is_none());
    }
}
