//! Device N as the main process of systemd's `zblk@N.service`
//! (`zblk setup --id N --foreground`), its store kept across a crash by
//! the unit's file-descriptor store, and the unit's `ExecStop`
//! (`zblk setup --id N --stop`).
//!
//! A crash goes like this: the daemon dies and the driver holds the
//! device's I/O (the device was made with USER_RECOVERY); systemd runs
//! `ExecStop`, which sees that the main process is gone and leaves the
//! device alone; `Restart=on-failure` starts us again with the store's
//! memfd (`LISTEN_FDS`, name `store`); we take the device over from it as
//! `zblk recover` does, and the driver reissues what it held. A handover
//! (`zblk restart`) is the same with a clean exit: the daemon stops
//! serving and exits with status 75, which the unit restarts on. A stop
//! (`systemctl stop`) runs `ExecStop` with the main process alive: swap
//! off, delete the device; the unit's store is closed with it.
//!
//! A section with `mount-point` is a filesystem: a new device is formatted
//! before `READY=1`, and the mount unit zblk's generator writes
//! ([`super::generator`]) mounts it after that and unmounts it before the
//! stop.

use super::add::Format;
use super::args::AddArgs;
use super::conf::Entry;
use super::{
    add,
    base::{CliError, CliResult},
    fs,
};
use std::os::fd::OwnedFd;
use std::time::Duration;
use zblk_ublk::{device, notify, Holder, Start};

/// How long a restarted daemon waits for the driver to notice that the
/// last one is gone (its state goes from `live` to `quiesced`).
const QUIESCED_WAIT: Duration = Duration::from_secs(5);

/// `zblk setup --id N --foreground`: take device N over from the store
/// systemd kept, or make it anew.
pub fn serve(e: Entry) -> CliResult {
    let id = e.add.dev.id.unwrap_or(0);
    // Before any thread starts: it reads and clears LISTEN_*.
    let stored = notify::take_stored_fd()
        .map_err(|err| CliError(format!("cannot read the descriptors systemd passed: {err}")))?;
    match (stored, settled_state(id)) {
        (Some(memfd), "quiesced") => recover(e.add, memfd),
        (stored, "gone") => {
            if stored.is_some() {
                log::warn!("device {id} is gone: the store systemd kept is of no use");
            }
            fresh(e)
        }
        (_, state) if add::is_live(id) => Err(CliError(format!(
            "device {id} is busy: a zblk daemon already serves it ({state})"
        ))),
        (_, state) => {
            // No store (the unit kept none) or a device that cannot take
            // one: what it held is lost; free the id for a new device.
            log::error!(
                "device {id} is {state} and no store can recover it: \
                 deleting it and making it anew (its pages are lost)"
            );
            device::give_up(id)?;
            fresh(e)
        }
    }
}

/// The driver's state of device `id` once it has seen the last daemon go
/// (`live` turns `quiesced` when the dead daemon's files are released).
fn settled_state(id: u32) -> &'static str {
    let mut state = device::driver_state(id);
    let t0 = std::time::Instant::now();
    while state == "live" && !add::is_live(id) && t0.elapsed() < QUIESCED_WAIT {
        std::thread::sleep(Duration::from_millis(50));
        state = device::driver_state(id);
    }
    state
}

/// Takes device `a.dev.id` over with the store in `memfd`. It is swap
/// already (the kernel kept the swap area): no mkswap, no swapon.
fn recover(a: AddArgs, memfd: OwnedFd) -> CliResult {
    let id = a.dev.id.unwrap_or(0);
    log::info!("device {id}: recovering from the store systemd kept");
    let mut dev = a.dev;
    dev.no_recovery = false;
    let ready = add::foreground_ready(a.json, Format::Raw);
    Ok(zblk_ublk::daemon::run(
        &dev,
        Start::Recover { memfd },
        None,
        ready,
    )?)
}

/// A new device, swap or a filesystem as the file says, its store in the
/// unit's fd store when systemd offers one (else without recovery: nobody
/// would keep it).
fn fresh(e: Entry) -> CliResult {
    let format = format(&e);
    if let Format::Fs(t) = format {
        t.check_mkfs()?;
    }
    let (a, holder) = foreground_args(e.add, notify::fd_store_offered());
    add::preflight(&a)?;
    add::foreground(a, format, holder)
}

/// What a section's new device becomes: swap, or its filesystem.
pub fn format(e: &Entry) -> Format {
    match &e.mount {
        Some(m) => Format::Fs(m.fs),
        None => Format::swap_if(&e.add, e.discard),
    }
}

/// The arguments and store holder of a device served in the foreground
/// (zblk@N.service): systemd's fd store when `fd_store` (we are the main
/// process of a notify unit), else nobody, and then no recovery: after a
/// crash nobody could recover the device and the driver would hold its
/// I/O (and swapoff) for good; without recovery the I/O fails, the
/// restart deletes the device and makes it anew.
pub fn foreground_args(mut a: AddArgs, fd_store: bool) -> (AddArgs, Holder) {
    a.foreground = true;
    if a.dev.no_recovery {
        return (a, Holder::Nobody);
    }
    if fd_store {
        return (a, Holder::Systemd);
    }
    log::info!(
        "serving device {} without recovery: no keeper and no service manager holds its store",
        a.dev.id.unwrap_or(0)
    );
    a.dev.no_recovery = true;
    (a, Holder::Nobody)
}

/// `zblk setup --id N --stop`, the unit's `ExecStop`. systemd runs it on
/// every stop, also after the main process exited on its own: after a
/// crash (the device is left to the restart, which recovers it), and
/// after a start that made no device (its section skipped on this
/// machine, or `zblk.disable`), when there is nothing to do. Otherwise
/// (or run by hand): unmount the device (under systemd its mount unit has
/// done so already) or swap it off, delete it.
pub fn stop(id: u32) -> CliResult {
    let gone = main_process_gone(
        std::env::var_os("SERVICE_RESULT").is_some(),
        std::env::var("MAINPID").ok(),
    );
    match stop_action(gone, device::driver_state(id)) {
        StopAction::Nothing => Ok(()),
        StopAction::LeaveToRestart => {
            println!("zblk@{id}: the daemon is gone; /dev/ublkb{id} is left to the restart");
            Ok(())
        }
        StopAction::Delete => {
            fs::unmount_all(&zblk_ublk::paths::bdev_path(id))?;
            super::manage::del_one(id, true)
        }
    }
}

/// What the unit's `ExecStop` does.
#[derive(Debug, PartialEq, Eq)]
enum StopAction {
    /// Nothing, quietly: no daemon and no device.
    Nothing,
    /// Leave the device, whose daemon is gone, to the restart.
    LeaveToRestart,
    /// Unmount or swap off, then delete the device.
    Delete,
}

/// [`StopAction`] when the main process is `main_gone` and the driver
/// says `state` ([`device::driver_state`]) of the device.
fn stop_action(main_gone: bool, state: &str) -> StopAction {
    match (main_gone, state) {
        (true, "gone") => StopAction::Nothing,
        (true, _) => StopAction::LeaveToRestart,
        (false, _) => StopAction::Delete,
    }
}

/// Whether we run as an `ExecStop` of a unit whose main process has
/// exited: systemd sets `SERVICE_RESULT` for stop commands
/// (`in_stop_command`) and leaves `MAINPID` unset once it knows the main
/// process is gone.
fn main_process_gone(in_stop_command: bool, mainpid: Option<String>) -> bool {
    in_stop_command && mainpid.map_or(true, |p| p.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::conf;
    use std::path::Path;

    const ONE: &str = "[ublkb0]\nsize = \"64\"\ncompression-algorithm = \"zstd:3\"\n";

    fn entry() -> Entry {
        let mut e = conf::parse(Path::new("t.conf"), ONE, 6000.0).unwrap();
        e.remove(0)
    }

    #[test]
    fn under_systemd_the_store_goes_to_the_fd_store() {
        let (a, holder) = foreground_args(entry().add, true);
        assert!(a.foreground && !a.dev.no_recovery && a.swap);
        assert!(matches!(holder, Holder::Systemd));
        assert_eq!(a.dev.engine.algo, zblk::Algo::Zstd(3));
    }

    #[test]
    fn without_a_holder_the_device_has_no_recovery() {
        let (a, holder) = foreground_args(entry().add, false);
        assert!(a.foreground && a.dev.no_recovery);
        assert!(matches!(holder, Holder::Nobody));
        let mut off = entry().add;
        off.dev.no_recovery = true;
        let (a, holder) = foreground_args(off, true);
        assert!(a.dev.no_recovery && matches!(holder, Holder::Nobody));
    }

    #[test]
    fn stop_leaves_a_crashed_device_to_the_restart() {
        assert!(main_process_gone(true, None));
        assert!(main_process_gone(true, Some(String::new())));
        assert!(
            !main_process_gone(true, Some("412".into())),
            "a live daemon is stopped"
        );
        assert!(
            !main_process_gone(false, None),
            "run by hand: it stops the device"
        );
        assert_eq!(stop_action(true, "quiesced"), StopAction::LeaveToRestart);
        assert_eq!(stop_action(false, "live"), StopAction::Delete);
    }

    /// A start that made no device (a skipped section) exited 0: its
    /// stop finds no daemon and no device, and says nothing.
    #[test]
    fn stop_after_a_skipped_start_does_nothing() {
        assert_eq!(stop_action(true, "gone"), StopAction::Nothing);
        // Run by hand, a stop of no device is still an error (del's).
        assert_eq!(stop_action(false, "gone"), StopAction::Delete);
    }
}
