//! How requests travel between the driver and a queue thread.
//!
//! - `classic`: one uring_cmd per tag: FETCH, then COMMIT_AND_FETCH for each
//!   request (every kernel with ublk).
//! - `batch` (`UBLK_F_BATCH_IO`, Linux 7.x): multishot fetch commands
//!   deliver many tags per completion into provided buffers, and one commit
//!   command completes a whole group of requests, so a storm of 4 KB swap
//!   writes costs a few commands per wake-up instead of one per page.
//!
//! The default is classic: a request at low queue depth costs batch a
//! fetch completion and a separate commit where classic has one
//! COMMIT_AND_FETCH, so classic is the faster at the depths swap-ins run
//! at (BENCHMARKS.md has the A/B, `tests/vm/run.sh --kernel 7.3 --scenario
//! transport-ab`). `auto` takes batch where the driver offers it.
//! The choice is the device's, made once at creation (`UBLK_F_BATCH_IO` in
//! its flags); a recovering daemon reads it back from the driver.
//!
//! A batch device hands over (`zblk restart`) without `UBLK_F_QUIESCE`, the
//! way a 6.12 device does (the daemon exits, the driver reissues what was
//! in flight): across a quiesce the 7.3 driver failed requests of a batch
//! device (read errors on swap in the upgrade scenario; the cause is not
//! found yet), while a crash-style handover passes the crash scenario.

use crate::features::Features;
use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// What `--transport` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportChoice {
    /// Batch where the driver has it, else classic.
    Auto,
    /// One command per request.
    #[default]
    Classic,
    /// `UBLK_F_BATCH_IO`; refused where the driver lacks it.
    Batch,
}

/// The transport a device uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// One command per request.
    #[default]
    Classic,
    /// `UBLK_F_BATCH_IO`.
    Batch,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Classic => "classic",
            Transport::Batch => "batch",
        })
    }
}

impl Transport {
    /// What `choice` gives on a driver with `features`; `Err` names what is
    /// missing.
    pub fn choose(choice: TransportChoice, features: Features) -> Result<Transport, String> {
        let has = features.has(libublk::sys::UBLK_F_BATCH_IO);
        match (choice, has) {
            (TransportChoice::Classic, _) | (TransportChoice::Auto, false) => {
                Ok(Transport::Classic)
            }
            (TransportChoice::Auto | TransportChoice::Batch, true) => Ok(Transport::Batch),
            (TransportChoice::Batch, false) => Err(
                "--transport batch: the ublk driver lacks UBLK_F_BATCH_IO (Linux 7.0 or later); \
                 use --transport classic or auto"
                    .into(),
            ),
        }
    }

    /// The transport of a device with driver flags `flags`.
    pub fn of_flags(flags: u64) -> Transport {
        if flags & u64::from(libublk::sys::UBLK_F_BATCH_IO) != 0 {
            Transport::Batch
        } else {
            Transport::Classic
        }
    }

    /// The control flag it needs at creation.
    pub fn ctrl_flags(self) -> u64 {
        match self {
            Transport::Classic => 0,
            Transport::Batch => u64::from(libublk::sys::UBLK_F_BATCH_IO),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_batch_only_where_the_driver_has_it() {
        let old = Features(0x1fe);
        let new = Features(0x1fffff);
        assert_eq!(
            Transport::choose(TransportChoice::Auto, old),
            Ok(Transport::Classic)
        );
        assert_eq!(
            Transport::choose(TransportChoice::Auto, new),
            Ok(Transport::Batch)
        );
        assert_eq!(
            Transport::choose(TransportChoice::Classic, new),
            Ok(Transport::Classic)
        );
        assert_eq!(
            Transport::choose(TransportChoice::Batch, new),
            Ok(Transport::Batch)
        );
        let e = Transport::choose(TransportChoice::Batch, old).unwrap_err();
        assert!(e.contains("UBLK_F_BATCH_IO"), "{e}");
    }

    #[test]
    fn flags_round_trip() {
        for t in [Transport::Classic, Transport::Batch] {
            assert_eq!(Transport::of_flags(t.ctrl_flags() | 0x18), t);
        }
    }
}
