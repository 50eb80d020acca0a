//! What the running ublk driver offers (`UBLK_U_CMD_GET_FEATURES`), in
//! words, and the recovery mode a device gets from it.
//!
//! Probed at run time, never assumed: Debian's 6.12 reports 0x1fe
//! (USER_RECOVERY and USER_RECOVERY_REISSUE, no QUIESCE); 6.15+ adds
//! QUIESCE and USER_RECOVERY_FAIL_IO.

use libublk::sys;
use serde::{Deserialize, Serialize};

/// The driver's feature bits and their UAPI names (`UBLK_F_` left off).
const NAMES: [(u32, &str); 20] = [
    (sys::UBLK_F_SUPPORT_ZERO_COPY, "SUPPORT_ZERO_COPY"),
    (sys::UBLK_F_URING_CMD_COMP_IN_TASK, "URING_CMD_COMP_IN_TASK"),
    (sys::UBLK_F_NEED_GET_DATA, "NEED_GET_DATA"),
    (sys::UBLK_F_USER_RECOVERY, "USER_RECOVERY"),
    (sys::UBLK_F_USER_RECOVERY_REISSUE, "USER_RECOVERY_REISSUE"),
    (sys::UBLK_F_UNPRIVILEGED_DEV, "UNPRIVILEGED_DEV"),
    (sys::UBLK_F_CMD_IOCTL_ENCODE, "CMD_IOCTL_ENCODE"),
    (sys::UBLK_F_USER_COPY, "USER_COPY"),
    (sys::UBLK_F_ZONED, "ZONED"),
    (sys::UBLK_F_USER_RECOVERY_FAIL_IO, "USER_RECOVERY_FAIL_IO"),
    (sys::UBLK_F_UPDATE_SIZE, "UPDATE_SIZE"),
    (sys::UBLK_F_AUTO_BUF_REG, "AUTO_BUF_REG"),
    (sys::UBLK_F_QUIESCE, "QUIESCE"),
    (sys::UBLK_F_PER_IO_DAEMON, "PER_IO_DAEMON"),
    (sys::UBLK_F_BUF_REG_OFF_DAEMON, "BUF_REG_OFF_DAEMON"),
    (sys::UBLK_F_BATCH_IO, "BATCH_IO"),
    (sys::UBLK_F_INTEGRITY, "INTEGRITY"),
    (sys::UBLK_F_SAFE_STOP_DEV, "SAFE_STOP_DEV"),
    (sys::UBLK_F_NO_AUTO_PART_SCAN, "NO_AUTO_PART_SCAN"),
    (sys::UBLK_F_SHMEM_ZC, "SHMEM_ZC"),
];

/// The driver's feature bits, as `GET_FEATURES` reports them (0 when the
/// driver is too old to know the command: Linux before 6.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Features(pub u64);

impl Features {
    /// Asks the loaded driver.
    pub fn probe() -> Features {
        Features(libublk::ctrl::UblkCtrl::get_features().unwrap_or(0))
    }

    /// Whether the driver has `flag` (a `UBLK_F_*` bit).
    pub fn has(self, flag: u32) -> bool {
        self.0 & u64::from(flag) != 0
    }

    /// The names of the bits set; unknown bits as `BIT<n>`.
    pub fn names(self) -> Vec<String> {
        (0..64)
            .filter(|b| self.0 & (1u64 << b) != 0)
            .map(|b| {
                NAMES
                    .iter()
                    .find(|(f, _)| u64::from(*f) == 1u64 << b)
                    .map_or_else(|| format!("BIT{b}"), |(_, n)| (*n).to_string())
            })
            .collect()
    }

    /// The recovery a device gets on this driver when it asks for one.
    pub fn recovery(self) -> Recovery {
        if !self.has(sys::UBLK_F_USER_RECOVERY) {
            Recovery::Off
        } else if self.has(sys::UBLK_F_USER_RECOVERY_REISSUE) {
            Recovery::Reissue
        } else {
            Recovery::Plain
        }
    }
}

/// How a device survives the death of its daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Recovery {
    /// `USER_RECOVERY_REISSUE`: the driver holds I/O while no daemon runs
    /// and issues the requests that were in flight again to the next one.
    Reissue,
    /// `USER_RECOVERY` only: I/O is held, but requests in flight at the
    /// crash fail with EIO (a swap read among them kills its process).
    Plain,
    /// None (`--no-recovery`, or a driver without USER_RECOVERY): the
    /// device dies with its daemon.
    #[default]
    Off,
}

impl Recovery {
    /// The `UBLK_F_*` flags that create a device with this recovery.
    pub fn ctrl_flags(self) -> u64 {
        let f = match self {
            Recovery::Reissue => sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE,
            Recovery::Plain => sys::UBLK_F_USER_RECOVERY,
            Recovery::Off => 0,
        };
        u64::from(f)
    }

    /// Whether a new daemon can take the device over.
    pub fn is_on(self) -> bool {
        self != Recovery::Off
    }
}

impl std::fmt::Display for Recovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Recovery::Reissue => "reissue",
            Recovery::Plain => "plain",
            Recovery::Off => "off",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_6_12_driver_in_words() {
        let f = Features(0x1fe);
        assert_eq!(
            f.names(),
            [
                "URING_CMD_COMP_IN_TASK",
                "NEED_GET_DATA",
                "USER_RECOVERY",
                "USER_RECOVERY_REISSUE",
                "UNPRIVILEGED_DEV",
                "CMD_IOCTL_ENCODE",
                "USER_COPY",
                "ZONED"
            ]
        );
        assert_eq!(f.recovery(), Recovery::Reissue);
        assert!(!f.has(sys::UBLK_F_QUIESCE));
        assert_eq!(Features(1 << 40).names(), ["BIT40"]);
    }

    #[test]
    fn recovery_falls_back_with_the_driver() {
        assert_eq!(Features(0x8).recovery(), Recovery::Plain);
        assert_eq!(Features(0x10).recovery(), Recovery::Off);
        assert_eq!(Features(0).recovery(), Recovery::Off);
        assert_eq!(Recovery::Reissue.ctrl_flags(), 0x18);
        assert_eq!(Recovery::Plain.ctrl_flags(), 0x8);
        assert_eq!(Recovery::Off.ctrl_flags(), 0);
        assert_eq!(
            serde_json::to_string(&Recovery::Plain).unwrap(),
            "\"plain\""
        );
        assert_eq!(Recovery::Reissue.to_string(), "reissue");
    }
}
