//! The system around the CLI: the driver, privileges, swap tools, waiting.

use super::base::CliError;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use zblk_ublk::paths;

/// Fails unless the ublk driver is loaded.
pub fn check_driver() -> Result<(), CliError> {
    if Path::new(paths::UBLK_CONTROL).exists() {
        return Ok(());
    }
    Err(CliError(format!(
        "no ublk driver ({} is missing): load it: modprobe ublk_drv; \
         needs Linux 6.0+ built with CONFIG_BLK_DEV_UBLK",
        paths::UBLK_CONTROL
    )))
}

/// Fails unless running as root.
pub fn check_root(what: &str) -> Result<(), CliError> {
    // SAFETY: geteuid has no preconditions.
    root_or_refusal(unsafe { libc::geteuid() }, what)
}

/// Fails unless `euid` is root's, saying what needs root in one line.
fn root_or_refusal(euid: libc::uid_t, what: &str) -> Result<(), CliError> {
    match euid {
        0 => Ok(()),
        _ => Err(CliError(format!("{what} needs root (run it with sudo)"))),
    }
}

/// Runs a system tool; fails with its stderr on one line.
pub fn run_tool(prog: &str, args: &[&str]) -> Result<(), CliError> {
    let out = Command::new(prog)
        .args(args)
        .output()
        .map_err(|e| CliError(format!("cannot run {prog}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let err = err.split_whitespace().collect::<Vec<_>>().join(" ");
    Err(CliError(format!(
        "{prog} {} failed ({}): {err}",
        args.join(" "),
        out.status
    )))
}

/// Polls `cond` every 20 ms for up to `timeout`.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if t0.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether something holds the block device (mounted, swap, opened
/// exclusively): an exclusive open fails with EBUSY then.
pub fn is_busy(bdev: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(bdev)
    {
        Ok(_) => false,
        Err(e) => e.raw_os_error() == Some(libc::EBUSY),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_passes_and_the_rest_get_one_line() {
        assert!(root_or_refusal(0, "zblk stat --by").is_ok());
        let e = root_or_refusal(1000, "zblk stat --by").unwrap_err().0;
        assert_eq!(e, "zblk stat --by needs root (run it with sudo)");
    }
}
