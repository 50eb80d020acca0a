//! Whether a device is active swap, from `/proc/swaps`.

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

#[cfg(test)]
mod tests {
    use super::*;

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
