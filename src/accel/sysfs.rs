//! Discovery of IAA work queues in sysfs.
//!
//! The idxd driver lists IAA devices as `/sys/bus/dsa/devices/iaxN` and
//! their work queues as `iaxN/wqN.M`, each with text attributes (`mode`,
//! `type`, `state`, `size`, `name`, `max_transfer_size`). A work queue the
//! backend can use is enabled, of type `user` (it then appears as
//! `/dev/iax/wqN.M`), on an enabled device, and takes a whole page per
//! descriptor. The root is a parameter so tests can point it at a fake tree.

use std::fs;
use std::path::{Path, PathBuf};

/// Where the idxd driver publishes its devices.
pub const DEFAULT_SYSFS_ROOT: &str = "/sys/bus/dsa/devices";
/// Where user-type work queues appear as character devices.
pub const DEFAULT_DEV_ROOT: &str = "/dev/iax";

/// How a work queue takes descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WqMode {
    /// One client; MOVDIR64B (posted: the submitter bounds in-flight work).
    Dedicated,
    /// Many clients; ENQCMD (non-posted: "retry" when the queue is full).
    Shared,
}

/// A usable IAA work queue found in sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WqInfo {
    /// Device name, e.g. `iax1`.
    pub device: String,
    /// Work queue name as the cdev is named, e.g. `wq1.0`.
    pub name: String,
    /// Dedicated or shared.
    pub mode: WqMode,
    /// Descriptor slots in the queue (the in-flight bound of a dedicated WQ).
    pub size: u32,
    /// Largest transfer a descriptor may name.
    pub max_transfer_size: u64,
    /// `/dev/iax/wqN.M` (under the configured dev root).
    pub cdev: PathBuf,
}

/// What discovery found: the usable queues, and why each other queue (or
/// the whole bus) was skipped, for the "why not hardware" log line.
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    /// Usable work queues, in name order.
    pub queues: Vec<WqInfo>,
    /// One line per device or queue that was skipped.
    pub skipped: Vec<String>,
}

impl Discovery {
    /// A one-line reason when no queue is usable.
    pub fn why_none(&self) -> String {
        if self.skipped.is_empty() {
            "no IAA device found".to_string()
        } else {
            self.skipped.join("; ")
        }
    }
}

/// Reads a sysfs attribute, trimmed; `None` when absent or unreadable.
fn attr(dir: &Path, name: &str) -> Option<String> {
    fs::read_to_string(dir.join(name))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Sorted entries of `dir` whose names start with `prefix`.
fn entries(dir: &Path, prefix: &str) -> Vec<(String, PathBuf)> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<(String, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(prefix).then(|| (name, e.path()))
        })
        .collect();
    v.sort();
    v
}

/// Finds the usable IAA work queues under `sysfs_root`, naming their cdevs
/// under `dev_root`. Never fails: an unreadable tree is "nothing found".
pub fn discover(sysfs_root: &Path, dev_root: &Path) -> Discovery {
    let mut d = Discovery::default();
    let devices = entries(sysfs_root, "iax");
    if devices.is_empty() {
        d.skipped
            .push(format!("no iax device under {}", sysfs_root.display()));
        return d;
    }
    for (dev, dev_dir) in devices {
        match attr(&dev_dir, "state").as_deref() {
            Some("enabled") | None => {}
            Some(s) => {
                d.skipped.push(format!("{dev}: device state {s}"));
                continue;
            }
        }
        let wqs = entries(&dev_dir, "wq");
        if wqs.is_empty() {
            d.skipped.push(format!("{dev}: no work queue configured"));
        }
        for (wq, wq_dir) in wqs {
            match check_wq(&dev, &wq, &wq_dir, dev_root) {
                Ok(info) => d.queues.push(info),
                Err(why) => d.skipped.push(format!("{dev}/{wq}: {why}")),
            }
        }
    }
    d
}

/// Checks one work queue's attributes.
fn check_wq(dev: &str, wq: &str, dir: &Path, dev_root: &Path) -> Result<WqInfo, String> {
    let state = attr(dir, "state").unwrap_or_default();
    if state != "enabled" {
        return Err(format!("state '{state}', not enabled"));
    }
    let ty = attr(dir, "type").unwrap_or_default();
    if ty != "user" {
        return Err(format!("type '{ty}', not user"));
    }
    let mode = match attr(dir, "mode").as_deref() {
        Some("dedicated") => WqMode::Dedicated,
        Some("shared") => WqMode::Shared,
        other => return Err(format!("unknown mode {other:?}")),
    };
    let size = attr(dir, "size")
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|&s| s > 0)
        .ok_or("no usable size")?;
    // Older kernels lack the attribute; a page is always allowed then.
    let max_transfer_size = attr(dir, "max_transfer_size")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    if max_transfer_size < crate::page::PAGE_SIZE as u64 {
        return Err(format!("max_transfer_size {max_transfer_size} < page"));
    }
    Ok(WqInfo {
        device: dev.to_string(),
        name: wq.to_string(),
        mode,
        size,
        max_transfer_size,
        cdev: dev_root.join(wq),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_wq(root: &Path, dev: &str, wq: &str, attrs: &[(&str, &str)]) {
        let dir = root.join(dev).join(wq);
        fs::create_dir_all(&dir).unwrap();
        for (k, v) in attrs {
            fs::write(dir.join(k), format!("{v}\n")).unwrap();
        }
    }

    #[test]
    fn finds_only_enabled_user_queues() {
        let t = std::env::temp_dir().join(format!("zblk-sysfs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&t);
        let ok = [
            ("state", "enabled"),
            ("type", "user"),
            ("mode", "shared"),
            ("size", "16"),
        ];
        write_wq(&t, "iax1", "wq1.0", &ok);
        write_wq(
            &t,
            "iax1",
            "wq1.1",
            &[
                ("state", "enabled"),
                ("type", "kernel"),
                ("mode", "dedicated"),
                ("size", "8"),
            ],
        );
        write_wq(
            &t,
            "iax1",
            "wq1.2",
            &[
                ("state", "disabled"),
                ("type", "user"),
                ("mode", "dedicated"),
                ("size", "8"),
            ],
        );
        write_wq(
            &t,
            "iax3",
            "wq3.0",
            &[
                ("state", "enabled"),
                ("type", "user"),
                ("mode", "dedicated"),
                ("size", "32"),
                ("max_transfer_size", "2097152"),
            ],
        );
        write_wq(&t, "dsa0", "wq0.0", &ok);
        fs::write(t.join("iax1").join("state"), "enabled\n").unwrap();
        let d = discover(&t, Path::new("/dev/iax"));
        let names: Vec<_> = d.queues.iter().map(|q| q.name.as_str()).collect();
        assert_eq!(names, ["wq1.0", "wq3.0"]);
        assert_eq!(d.queues[0].mode, WqMode::Shared);
        assert_eq!(d.queues[1].mode, WqMode::Dedicated);
        assert_eq!(d.queues[1].size, 32);
        assert_eq!(d.queues[1].cdev, Path::new("/dev/iax/wq3.0"));
        assert_eq!(d.skipped.len(), 2, "{:?}", d.skipped);
        let none = discover(&t.join("missing"), Path::new("/dev/iax"));
        assert!(none.queues.is_empty());
        assert!(none.why_none().contains("no iax device"));
        fs::remove_dir_all(&t).unwrap();
    }
}
