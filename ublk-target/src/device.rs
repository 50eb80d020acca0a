//! The ublk device itself: adding it to the driver, its block-device
//! parameters, and deleting one whose daemon is gone.

use crate::config::DeviceConfig;
use crate::error::{Error, Result, Step, UblkCause};
use crate::{params, paths};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::UblkDev;
use libublk::{UblkError, UblkFlags};

/// Adds the device of `cfg` to the driver (not started yet: no queues, no
/// disk). Its id and I/O buffer size are the driver's answer
/// (`dev_info()`).
pub fn create(cfg: &DeviceConfig) -> Result<UblkCtrl> {
    UblkCtrlBuilder::default()
        .name("zblk")
        .id(cfg.ublk_id())
        .nr_queues(cfg.queue_count())
        .depth(cfg.depth)
        .io_buf_bytes(cfg.io_buf_bytes())
        .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV | UblkFlags::UBLK_DEV_F_MLOCK_IO_BUFFER)
        .build()
        .map_err(Error::ublk(Step::CreateDevice))
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
