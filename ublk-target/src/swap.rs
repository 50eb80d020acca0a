//! Whether a device is active swap, from `/proc/swaps`.

use crate::error::{Error, Result, Step};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The device paths listed in a `/proc/swaps` text (header skipped; the
/// kernel escapes spaces in paths as `\040`).
pub fn parse_swaps(text: &str) -> Vec<String> {
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .map(|p| p.replace("\\040", " "))
        .collect()
}

/// Whether `dev` (e.g. `/dev/ublkb0`) is in `/proc/swaps`, by path or by
/// device number (so that a symlink used with swapon still counts).
pub fn is_active_swap(dev: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/swaps") else {
        return false;
    };
    let rdev = std::fs::metadata(dev).ok().map(|m| m.rdev());
    parse_swaps(&text).iter().any(|p| {
        Path::new(p) == dev
            || (rdev.is_some() && std::fs::metadata(p).ok().map(|m| m.rdev()) == rdev)
    })
}

/// `SWAP_FLAG_PREFER` (include/uapi/linux/swap.h): the priority is given.
const SWAP_FLAG_PREFER: libc::c_int = 0x8000;
/// `SWAP_FLAG_PRIO_MASK`.
const SWAP_FLAG_PRIO_MASK: libc::c_int = 0x7fff;
/// `SWAP_FLAG_DISCARD`: discard at swapon and as slots are freed (what
/// `swapon --discard` asks for; the only way a ublk device learns that a
/// swap slot is free).
const SWAP_FLAG_DISCARD: libc::c_int = 0x10000;

/// `SWAP_FLAG_DISCARD_ONCE`: discard the whole area at swapon only.
const SWAP_FLAG_DISCARD_ONCE: libc::c_int = 0x20000;
/// `SWAP_FLAG_DISCARD_PAGES`: discard freed slots only.
const SWAP_FLAG_DISCARD_PAGES: libc::c_int = 0x40000;

/// When the kernel sends discards to a swap area: swapon's `--discard`
/// policies (fstab's `discard`, `discard=once`, `discard=pages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discard {
    /// Never: freed slots keep their pages stored (no option).
    Off,
    /// At swapon and for every freed slot (`discard`): what zblk wants.
    Both,
    /// At swapon only (`discard=once`).
    Once,
    /// For freed slots only (`discard=pages`).
    Pages,
}

impl Discard {
    /// The swapon(2) flag bits of this policy.
    fn flags(self) -> libc::c_int {
        match self {
            Discard::Off => 0,
            Discard::Both => SWAP_FLAG_DISCARD,
            Discard::Once => SWAP_FLAG_DISCARD | SWAP_FLAG_DISCARD_ONCE,
            Discard::Pages => SWAP_FLAG_DISCARD | SWAP_FLAG_DISCARD_PAGES,
        }
    }

    /// Reads swapon options as fstab writes them (`discard`,
    /// `discard=pages`, comma-separated; empty: no discard). Only the
    /// discard policies mean something for swapon(2); any other word is
    /// refused rather than ignored.
    pub fn from_options(options: &str) -> std::result::Result<Discard, String> {
        let mut d = Discard::Off;
        for word in options.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            d = match word {
                "discard" => Discard::Both,
                "discard=once" => Discard::Once,
                "discard=pages" => Discard::Pages,
                _ => {
                    return Err(format!(
                        "unknown swap option '{word}' (known: discard, discard=once, discard=pages)"
                    ))
                }
            };
        }
        Ok(d)
    }
}

impl std::fmt::Display for Discard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Discard::Off => "no discard",
            Discard::Both => "discard",
            Discard::Once => "discard=once",
            Discard::Pages => "discard=pages",
        })
    }
}

/// The swapon(2) flags for discard and `priority` (-1: the kernel's
/// default, decreasing priority).
pub fn swapon_flags(priority: i32) -> libc::c_int {
    swapon_flags_with(priority, Discard::Both)
}

/// The swapon(2) flags for a discard policy and `priority`.
pub fn swapon_flags_with(priority: i32, discard: Discard) -> libc::c_int {
    let mut flags = discard.flags();
    if priority >= 0 {
        flags |= SWAP_FLAG_PREFER | (priority & SWAP_FLAG_PRIO_MASK);
    }
    flags
}

fn c_path(dev: &Path) -> Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(dev.as_os_str().as_bytes())
        .map_err(|_| Error::NulInPath(dev.to_path_buf()))
}

/// Enables swap on `dev` with discard, by the system call (the guest's
/// busybox swapon knows neither `--discard` nor a priority).
pub fn swap_on(dev: &Path, priority: i32) -> Result<()> {
    swap_on_with(dev, priority, Discard::Both)
}

/// Enables swap on `dev` with a discard policy (`zblk setup`'s
/// `options`).
pub fn swap_on_with(dev: &Path, priority: i32, discard: Discard) -> Result<()> {
    let path = c_path(dev)?;
    let flags = swapon_flags_with(priority, discard);
    // SAFETY: a valid NUL-terminated path and integer flags.
    if unsafe { libc::swapon(path.as_ptr(), flags) } != 0 {
        return Err(Error::last_os(Step::SwapOn(dev.to_path_buf())));
    }
    Ok(())
}

/// Disables swap on `dev` (the kernel first swaps every page back in).
pub fn swap_off(dev: &Path) -> Result<()> {
    let path = c_path(dev)?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::swapoff(path.as_ptr()) } != 0 {
        return Err(Error::last_os(Step::SwapOff(dev.to_path_buf())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swapon_flags_match_util_linux() {
        // swapon --discard -p 100
        assert_eq!(swapon_flags(100), 0x10000 | 0x8000 | 100);
        assert_eq!(swapon_flags(0), 0x10000 | 0x8000);
        assert_eq!(swapon_flags(32767), 0x10000 | 0x8000 | 0x7fff);
        // No priority: discard only.
        assert_eq!(swapon_flags(-1), 0x10000);
        // swapon --discard=once / --discard=pages, and no discard.
        assert_eq!(swapon_flags_with(-1, Discard::Once), 0x30000);
        assert_eq!(swapon_flags_with(5, Discard::Pages), 0x50000 | 0x8000 | 5);
        assert_eq!(swapon_flags_with(-1, Discard::Off), 0);
    }

    #[test]
    fn swap_options_read_as_fstab_writes_them() {
        let d = |s| Discard::from_options(s);
        assert_eq!(d("discard"), Ok(Discard::Both));
        assert_eq!(d(" discard=pages "), Ok(Discard::Pages));
        assert_eq!(d("discard=once"), Ok(Discard::Once));
        assert_eq!(d(""), Ok(Discard::Off));
        let e = d("discard,nofail").unwrap_err();
        assert!(e.contains("unknown swap option 'nofail'"), "{e}");
    }

    #[test]
    fn swapoff_of_a_missing_device_is_an_error() {
        let e = swap_off(Path::new("/dev/ublkb4095"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("swapoff /dev/ublkb4095: "), "{e}");
    }

    #[test]
    fn parses_proc_swaps() {
        let t = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
                 /dev/ublkb0                             partition\t8388604\t\t0\t\t100\n\
                 /swap\\040file                           file\t\t1024\t\t0\t\t-2\n";
        assert_eq!(
            parse_swaps(t),
            vec!["/dev/ublkb0".to_string(), "/swap file".to_string()]
        );
        assert!(parse_swaps("Filename Type Size Used Priority\n").is_empty());
        assert!(parse_swaps("").is_empty());
    }

    #[test]
    fn a_device_that_does_not_exist_is_not_swap() {
        assert!(!is_active_swap(Path::new("/dev/ublkb4095")));
    }
}
