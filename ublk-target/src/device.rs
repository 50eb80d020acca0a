//! The ublk device itself: adding it to the driver (with user recovery
//! when asked and offered), taking over one whose daemon died, its
//! block-device parameters, and deleting one whose daemon is gone.

use crate::config::DeviceConfig;
use crate::error::{Error, Result, Step, UblkCause};
use crate::features::{Features, Recovery};
use crate::transport::Transport;
use crate::{io_threads, params, paths};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::UblkDev;
use libublk::{UblkError, UblkFlags};
use std::time::{Duration, Instant};

/// How long a new daemon waits for the driver to let go of the dead one
/// (its `/dev/ublkcN` released and the device quiesced).
const RECOVER_WAIT: Duration = Duration::from_secs(30);

/// Adds the device of `cfg` to the driver (not started yet: no queues, no
/// disk), with `recovery`'s flags, and with `UBLK_F_QUIESCE` where the
/// driver has it and recovery is on (the graceful handover of `zblk
/// restart`), with `transport`'s flag, and with `cfg`'s I/O threads a
/// queue ([`crate::io_threads`], checked against the driver before; the
/// driver sets `UBLK_F_PER_IO_DAEMON` itself). Its id and I/O buffer
/// size are the driver's answer (`dev_info()`).
pub fn create(
    cfg: &DeviceConfig,
    recovery: Recovery,
    features: Features,
    transport: Transport,
) -> Result<UblkCtrl> {
    let mut flags = recovery.ctrl_flags() | transport.ctrl_flags();
    if recovery.is_on() && features.has(libublk::sys::UBLK_F_QUIESCE) {
        flags |= u64::from(libublk::sys::UBLK_F_QUIESCE);
    }
    builder(cfg, cfg.io_threads)
        .id(cfg.ublk_id())
        .ctrl_flags(flags)
        .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV | UblkFlags::UBLK_DEV_F_MLOCK_IO_BUFFER)
        .build()
        .map_err(Error::ublk(Step::CreateDevice))
}

/// Takes over device `id` (of `cfg`, as it was resolved when it was
/// created) whose daemon died: `START_USER_RECOVERY` once the driver has
/// let go of the dead daemon, then a control for recovery, whose start
/// (`run_target`) ends with `END_USER_RECOVERY`. The device is served
/// with `cfg`'s I/O threads a queue when it has `UBLK_F_PER_IO_DAEMON`,
/// else with one (`io_threads_per_queue()` says which).
pub fn recover(cfg: &DeviceConfig, id: u32) -> Result<UblkCtrl> {
    let sid = i32::try_from(id).map_err(|_| Error::IdOutOfRange(id))?;
    let simple = UblkCtrl::new_simple(sid).map_err(Error::ublk(Step::OpenDevice(id)))?;
    let threads = io_threads::recovered(cfg.io_threads, simple.dev_info().flags);
    if threads != cfg.io_threads {
        log::warn!(
            "device {id} has no UBLK_F_PER_IO_DAEMON: \
             served with 1 I/O thread a queue, not {}",
            cfg.io_threads
        );
    }
    start_recovery(&simple, id)?;
    builder(cfg, threads)
        .id(sid)
        .dev_flags(UblkFlags::UBLK_DEV_F_RECOVER_DEV | UblkFlags::UBLK_DEV_F_MLOCK_IO_BUFFER)
        .build()
        .map_err(Error::ublk(Step::StartRecovery(id)))
}

/// `START_USER_RECOVERY`, again while the driver answers EBUSY (the dead
/// daemon's descriptors are still being released).
fn start_recovery(ctrl: &UblkCtrl, id: u32) -> Result<()> {
    let t0 = Instant::now();
    loop {
        match ctrl.start_user_recover() {
            Ok(r) if r != -libc::EBUSY => return Ok(()),
            Err(UblkError::OtherError(e)) if e != -libc::EBUSY => {
                return Err(Error::Ublk {
                    step: Step::StartRecovery(id),
                    source: UblkError::OtherError(e),
                })
            }
            Err(e @ (UblkError::IOError(_) | UblkError::UringIOError(_))) => {
                return Err(Error::Ublk {
                    step: Step::StartRecovery(id),
                    source: e,
                })
            }
            _ if t0.elapsed() > RECOVER_WAIT => {
                return Err(Error::Ublk {
                    step: Step::StartRecovery(id),
                    source: UblkError::OtherError(-libc::EBUSY),
                })
            }
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// The builder settings a device and its recovery share, with `threads`
/// I/O threads a queue.
fn builder(cfg: &DeviceConfig, threads: u16) -> UblkCtrlBuilder<'static> {
    UblkCtrlBuilder::default()
        .name("zblk")
        .nr_queues(cfg.queue_count())
        .depth(cfg.depth)
        .io_buf_bytes(cfg.io_buf_bytes())
        .io_threads_per_queue(threads)
}

/// Deletes device `id` whose daemon is gone and will not come back (the
/// keeper gave up): stopping it fails the I/O the driver holds.
pub fn give_up(id: u32) -> Result<()> {
    let sid = i32::try_from(id).map_err(|_| Error::IdOutOfRange(id))?;
    let ctrl = UblkCtrl::new_simple(sid).map_err(Error::ublk(Step::OpenDevice(id)))?;
    let _ = ctrl.kill_dev();
    delete(&ctrl, id)
}

/// Device `id`'s state as the driver reports it, in `zblk list`'s words:
/// `live`, `quiesced` (no daemon; the driver holds its I/O for the next
/// one), `fail-io` (no daemon; its I/O fails), `dead` (stopped), or
/// `gone` (no such device).
pub fn driver_state(id: u32) -> &'static str {
    let Ok(sid) = i32::try_from(id) else {
        return "gone";
    };
    let Ok(ctrl) = UblkCtrl::new_simple(sid) else {
        return "gone";
    };
    match u32::from(ctrl.dev_info().state) {
        libublk::sys::UBLK_S_DEV_LIVE => "live",
        libublk::sys::UBLK_S_DEV_QUIESCED => "quiesced",
        libublk::sys::UBLK_S_DEV_FAIL_IO => "fail-io",
        _ => "dead",
    }
}

/// Deletes a device this process took over (a control for recovery does
/// not delete its device when dropped, one for adding does).
pub fn delete_recovered(ctrl: &UblkCtrl, id: u32) {
    if let Err(e) = delete(ctrl, id) {
        log::warn!("{e}");
    }
}

/// Sets the block-device parameters of a `size`-byte device ([`params`]):
/// libublk's target initialiser.
pub fn init_target(dev: &mut UblkDev, size: u64) -> std::result::Result<(), UblkError> {
    dev.set_default_params(size);
    dev.tgt.params = params::device_params(size, dev.dev_info.max_io_buf_bytes);
    Ok(())
}

/// Stops a started device: its queues end and its disk goes away.
pub fn stop(ctrl: &UblkCtrl, id: u32) {
    if let Err(e) = ctrl.kill_dev() {
        log::warn!("stop device {id}: {}", UblkCause(&e));
    }
}

/// Deletes device `id` whose daemon is gone (it left its socket behind:
/// killed, or crashed). Only for ids that have a zblk socket, so that a
/// device served by another ublk program is never touched.
pub fn delete_orphan(id: u32) -> Result<()> {
    let sock = paths::socket_path(id);
    if !sock.exists() {
        return Err(Error::NotZblk(id));
    }
    let sid = i32::try_from(id).map_err(|_| Error::IdOutOfRange(id))?;
    if paths::cdev_path(id).exists() {
        let ctrl = UblkCtrl::new_simple(sid).map_err(Error::ublk(Step::OpenDevice(id)))?;
        // Stopping may fail when the driver already stopped it.
        let _ = ctrl.kill_dev();
        delete(&ctrl, id)?;
    }
    std::fs::remove_file(&sock).map_err(Error::os(Step::RemoveSocket(sock.clone())))
}

/// Deletes a stopped device without waiting for its last user.
///
/// The synchronous delete waits for the kernel's last reference to the
/// disk, which a swap area left behind by a killed daemon never drops: it
/// would hang. The asynchronous one (Linux 6.9+) returns at once and the
/// device goes when its last user lets go; older kernels get the
/// synchronous one.
fn delete(ctrl: &UblkCtrl, id: u32) -> Result<()> {
    if let Err(e) = ctrl.del_dev_async() {
        log::info!(
            "asynchronous delete of device {id} refused ({}); deleting synchronously",
            UblkCause(&e)
        );
        ctrl.del_dev()
            .map_err(Error::ublk(Step::DeleteDevice(id)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphans_need_a_zblk_socket() {
        let e = delete_orphan(1_000_000).unwrap_err().to_string();
        assert!(e.contains("has no zblk socket"), "{e}");
    }
}
