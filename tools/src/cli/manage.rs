//! `zblk del`, `zblk compact`, `zblk set`, `zblk idle`, `zblk recompress`,
//! `zblk recover`, `zblk restart`.

use super::args::{CompactArgs, DelArgs, IdArgs, IdleArgs, RecoverArgs, SetArgs};
use super::{
    base::{CliError, CliResult},
    sys,
};
use std::time::Duration;
use zblk_ublk::control::{self, ClientError, Request};
use zblk_ublk::keeper::{self, KeeperRequest};
use zblk_ublk::{paths, swap};

/// How long `restart` waits for the handover (old daemon out, new one in).
const RESTART_WAIT: Duration = Duration::from_secs(120);

/// How long `del` waits for a daemon to delete its device and exit.
const DEL_WAIT: Duration = Duration::from_secs(30);

/// How long `del` then waits for the device's keeper to leave.
const KEEPER_WAIT: Duration = Duration::from_secs(5);

/// `zblk del -n ID | --all [--force]`.
pub fn del(a: DelArgs) -> CliResult {
    let ids = match a.id {
        Some(id) => vec![id],
        None => super::base::device_ids()?,
    };
    let mut first_err = None;
    for id in ids {
        if a.all && mounted(id) {
            continue;
        }
        if let Err(e) = del_one(id, a.force) {
            if a.all {
                // Go on with the others; report every failure.
                eprintln!("zblk: {e}");
                first_err.get_or_insert(e);
            } else {
                return Err(e);
            }
        }
    }
    match first_err {
        Some(_) => Err(CliError("some devices were not deleted".into())),
        None => Ok(()),
    }
}

/// Whether device `id` holds a mounted filesystem, which `del --all`
/// leaves, saying so: deleting the device under it would lose the files
/// and leave a mount whose every I/O fails (zblk-setup.service's stop runs
/// `del --all --force`; a filesystem's zblk@N.service deletes its device
/// after the unmount).
fn mounted(id: u32) -> bool {
    let bdev = paths::bdev_path(id);
    let points = super::fs::mounts_of(&bdev);
    if let Some(p) = points.first() {
        eprintln!("zblk: {} is mounted on {p}: left alone", bdev.display());
    }
    !points.is_empty()
}

/// Deletes device `id` (swapping it off first with `force`).
pub(super) fn del_one(id: u32, force: bool) -> CliResult {
    let bdev = paths::bdev_path(id);
    let sock = paths::socket_path(id);
    // A non-root user cannot even look into the run directory: say so,
    // rather than that the device does not exist.
    match sock.try_exists() {
        Ok(true) => {}
        Ok(false) => return Err(control::ClientError::NoDevice(id).into()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(control::ClientError::PermissionDenied.into())
        }
        Err(e) => return Err(CliError(format!("cannot look for {}: {e}", sock.display()))),
    }
    if swap::is_active_swap(&bdev) {
        if !force {
            return Err(CliError(format!(
                "device {} is busy: it is active swap (swapoff it first, or use --force)",
                bdev.display()
            )));
        }
        swap::swap_off(&bdev).map_err(|e| CliError(format!("{e}; device {id} kept")))?;
    } else if !force && sys::is_busy(&bdev) {
        return Err(CliError(format!(
            "device {} is busy (mounted or held open; unmount it, or use --force)",
            bdev.display()
        )));
    }
    match control::request(id, &Request::Shutdown { force }, Duration::from_secs(10)) {
        Ok(_) => {}
        // A socket with nobody behind it: the daemon was killed. Delete
        // the device it left.
        Err(control::ClientError::NoDevice(_)) => {
            return Ok(zblk_ublk::device::delete_orphan(id)?);
        }
        Err(e) => return Err(e.into()),
    }
    if !sys::wait_for(DEL_WAIT, || !sock.exists()) {
        return Err(CliError(format!(
            "device {id} did not go away within {DEL_WAIT:?}"
        )));
    }
    // And its keeper, which leaves once the daemon has: under systemd the
    // unit's stop kills what is left in its cgroup as soon as we return,
    // and a keeper killed then leaves its socket behind.
    let keeper_sock = paths::keeper_socket_path(id);
    if keeper_sock.exists() && !sys::wait_for(KEEPER_WAIT, || !keeper_sock.exists()) {
        log::warn!("device {id}: its keeper did not leave within {KEEPER_WAIT:?}");
    }
    Ok(())
}

/// `zblk compact -n ID [--backing [--max-blocks N]]`.
pub fn compact(a: CompactArgs) -> CliResult {
    if a.backing {
        return compact_backing(a.id, a.max_blocks.unwrap_or(0));
    }
    let r = control::request(a.id, &Request::Compact, Duration::from_secs(120))?;
    println!(
        "pages_compacted {}",
        r["pages_compacted"].as_u64().unwrap_or(0)
    );
    Ok(())
}

/// How long `zblk compact --backing` waits for the daemon: it reads and
/// writes the backing device, as a writeback does.
const COMPACT_BACKING_TIMEOUT: Duration = Duration::from_secs(600);

/// `zblk compact -n ID --backing [--max-blocks N]` (0: every sparse
/// block): what it moved, and the backing device's used bytes before and
/// after against its live bytes.
fn compact_backing(id: u32, max_blocks: u64) -> CliResult {
    let req = Request::CompactBacking { max_blocks };
    let r = control::request(id, &req, COMPACT_BACKING_TIMEOUT)?;
    let n = |k: &str| r[k].as_u64().unwrap_or(0);
    println!(
        "blocks_looked {} objects_moved {} groups_moved {} bytes_moved {} blocks_written {} \
         blocks_freed {} raced {} corrupt {} unreadable {} full {}",
        n("blocks_looked"),
        n("objects_moved"),
        n("groups_moved"),
        n("bytes_moved"),
        n("blocks_written"),
        n("blocks_freed"),
        n("raced"),
        n("corrupt"),
        n("unreadable"),
        r["full"].as_bool().unwrap_or(false)
    );
    println!(
        "bd_used_bytes {} -> {} bd_bytes {}",
        n("bd_used_bytes_before"),
        n("bd_used_bytes"),
        n("bd_bytes")
    );
    Ok(())
}

/// `zblk set -n ID [--mem-limit SIZE] [--writeback-limit PAGES]
/// [--recompress-idle-after SECS] [--writeback-idle-after SECS]
/// [--recompress-algos ALGOS]`.
pub fn set(a: SetArgs) -> CliResult {
    if let Some(bytes) = a.mem_limit {
        control::request(
            a.id,
            &Request::SetMemLimit { bytes },
            Duration::from_secs(10),
        )?;
    }
    if let Some(pages) = a.writeback_limit {
        control::request(
            a.id,
            &Request::SetWritebackLimit { pages },
            Duration::from_secs(10),
        )?;
    }
    let policy_given = a.recompress_idle_after.is_some()
        || a.writeback_idle_after.is_some()
        || a.recompress_algo.is_some();
    if policy_given {
        let policy = Request::SetPolicy {
            recompress_idle_after: a.recompress_idle_after,
            writeback_idle_after: a.writeback_idle_after,
            recompress_algo: a.recompress_algo,
        };
        control::request(a.id, &policy, Duration::from_secs(10))?;
    }
    Ok(())
}

/// `zblk idle -n ID --age SECS | --all`.
pub fn idle(a: IdleArgs) -> CliResult {
    let age = if a.all { None } else { a.age };
    let r = control::request(
        a.id,
        &Request::Idle { age, exact: false },
        Duration::from_secs(120),
    )?;
    println!("marked {}", r["marked"].as_u64().unwrap_or(0));
    Ok(())
}

/// The keeper's answer to `req`, or a one-line reason.
fn ask_keeper(id: u32, req: &KeeperRequest) -> Result<serde_json::Value, CliError> {
    keeper::request(id, req, RESTART_WAIT).map_err(|e| match e {
        ClientError::NoDevice(_) => CliError(format!(
            "device {id} has no keeper ({} is missing): it was added with --no-recovery, \
             in the foreground, or its keeper is gone",
            paths::keeper_socket_path(id).display()
        )),
        e => e.into(),
    })
}

/// `zblk restart -n ID`: the keeper has the daemon hand over and starts
/// the binary now at its path, which takes the device over. A device with
/// no keeper may be a systemd unit's (`zblk@N.service`): its daemon hands
/// over and exits, systemd starts the binary again with the store.
pub fn restart(a: IdArgs) -> CliResult {
    let r = match keeper::request(a.id, &KeeperRequest::Restart, RESTART_WAIT) {
        Ok(r) => r,
        // No keeper listens (none was started, or a socket file outlived
        // it): a unit's daemon, or one nobody can restart (it says so).
        Err(ClientError::NoDevice(_)) => return restart_unit(a.id),
        Err(e) => return Err(e.into()),
    };
    println!(
        "device {}: handed over to daemon pid {} in {} ms",
        a.id,
        r["pid"].as_u64().unwrap_or(0),
        r["ms"].as_u64().unwrap_or(0)
    );
    Ok(())
}

/// A handover with no keeper: the daemon (which refuses when nobody keeps
/// its store) stops serving and exits; whoever supervises it (systemd,
/// with the store in its fd store) starts the next one. Waits until a
/// daemon with another pid answers.
fn restart_unit(id: u32) -> CliResult {
    let old = daemon_pid(id).map_err(|e| {
        CliError(format!(
            "device {id} has no keeper and its daemon does not answer: {e}"
        ))
    })?;
    let t0 = std::time::Instant::now();
    control::request(id, &Request::Handover, Duration::from_secs(10))?;
    let mut new = None;
    let back = sys::wait_for(RESTART_WAIT, || {
        new = daemon_pid(id).ok().filter(|&p| p != old);
        new.is_some()
    });
    if !back {
        return Err(CliError(format!(
            "device {id}: the daemon handed over but no new one serves it after {RESTART_WAIT:?} \
             (is it a systemd unit's? `systemctl status zblk@{id}`)"
        )));
    }
    println!(
        "device {id}: handed over to daemon pid {} in {} ms",
        new.unwrap_or(0),
        t0.elapsed().as_millis()
    );
    Ok(())
}

/// The pid of the daemon that answers for device `id`.
fn daemon_pid(id: u32) -> Result<u64, ClientError> {
    let r = control::request(id, &Request::Info, Duration::from_secs(2))?;
    Ok(r["pid"].as_u64().unwrap_or(0))
}

/// `zblk recover -n ID` (by hand): the keeper starts a recovering daemon
/// unless one serves the device.
pub fn recover(a: RecoverArgs) -> CliResult {
    let r = ask_keeper(a.id, &KeeperRequest::Recover)?;
    println!(
        "device {}: recovering daemon pid {}",
        a.id,
        r["pid"].as_u64().unwrap_or(0)
    );
    Ok(())
}
