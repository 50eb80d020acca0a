//! Where zblk keeps its run-time files.

use std::path::{Path, PathBuf};

/// Directory of control sockets and daemon logs (root only, mode 0700).
pub const RUN_DIR: &str = "/run/zblk";

/// The control device of the ublk driver; absent when it is not loaded.
pub const UBLK_CONTROL: &str = "/dev/ublk-control";

/// Control socket of device `id`.
pub fn socket_path(id: u32) -> PathBuf {
    socket_path_in(Path::new(RUN_DIR), id)
}

/// Control socket of device `id` in `dir` (a stand-in for [`RUN_DIR`]
/// in tests).
pub fn socket_path_in(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("{id}.sock"))
}

/// Socket of the keeper of device `id` (see `crate::keeper`); its name
/// does not parse as a device id, so [`device_ids`] skips it.
pub fn keeper_socket_path(id: u32) -> PathBuf {
    PathBuf::from(format!("{RUN_DIR}/{id}.keeper.sock"))
}

/// Log file of the daemon of device `id` (when not in the foreground).
pub fn log_path(id: u32) -> PathBuf {
    PathBuf::from(format!("{RUN_DIR}/{id}.log"))
}

/// The block device node of device `id`.
pub fn bdev_path(id: u32) -> PathBuf {
    PathBuf::from(format!("/dev/ublkb{id}"))
}

/// The character device node of device `id`.
pub fn cdev_path(id: u32) -> PathBuf {
    PathBuf::from(format!("/dev/ublkc{id}"))
}

/// Creates [`RUN_DIR`] (mode 0700) if needed.
pub fn ensure_run_dir() -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o700).create(RUN_DIR) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::set_permissions(RUN_DIR, std::fs::Permissions::from_mode(0o700))
        }
        Err(e) => Err(e),
    }
}

/// Ids of the devices that have a control socket, in order (none when
/// [`RUN_DIR`] does not exist).
pub fn device_ids() -> std::io::Result<Vec<u32>> {
    device_ids_in(Path::new(RUN_DIR))
}

/// Ids of the devices that have a control socket in `dir` (a stand-in for
/// [`RUN_DIR`] in tests), in order; none when `dir` does not exist.
pub fn device_ids_in(dir: &Path) -> std::io::Result<Vec<u32>> {
    let dir = match std::fs::read_dir(dir) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut ids: Vec<u32> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".sock")?.parse().ok()
        })
        .collect();
    ids.sort_unstable();
    Ok(ids)
}
