//! The filesystem of a device whose section has a `mount-point` (as
//! zram-generator's): its type and `mkfs` command line, mounting it, and
//! finding and undoing its mounts before the device goes.

use super::{
    base::{CliError, CliResult},
    sys,
};
use std::path::{Path, PathBuf};

/// The filesystems `fs-type` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsType {
    /// No journal of its own.
    Ext2,
    /// ext2 with a journal: what `ext3` means.
    Ext3,
    /// The default (zram-generator's is ext2; ext4 is the same without a
    /// journal, with extents and a faster fsck).
    Ext4,
    /// Always with a log.
    Xfs,
    /// Copy-on-write.
    Btrfs,
}

impl FsType {
    /// Every type, in the order errors list them.
    pub const ALL: [FsType; 5] = [
        FsType::Ext2,
        FsType::Ext3,
        FsType::Ext4,
        FsType::Xfs,
        FsType::Btrfs,
    ];

    /// `fs-type` as written: one of [`FsType::ALL`]'s names.
    pub fn parse(name: &str) -> Result<FsType, String> {
        Self::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|t| t.name()).collect();
                format!(
                    "unknown fs-type '{}': one of {}",
                    super::base::escape_controls(name),
                    names.join(", ")
                )
            })
    }

    /// Its name for `mount -t` and `mkfs.NAME`.
    pub fn name(self) -> &'static str {
        match self {
            FsType::Ext2 => "ext2",
            FsType::Ext3 => "ext3",
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
            FsType::Btrfs => "btrfs",
        }
    }

    /// The program that makes it.
    pub fn mkfs(self) -> String {
        format!("mkfs.{}", self.name())
    }

    /// The package that has [`FsType::mkfs`] (the same name in Debian,
    /// Fedora and Arch).
    pub fn package(self) -> &'static str {
        match self {
            FsType::Ext2 | FsType::Ext3 | FsType::Ext4 => "e2fsprogs",
            FsType::Xfs => "xfsprogs",
            FsType::Btrfs => "btrfs-progs",
        }
    }

    /// `mkfs`'s options before the device. The device is new, every page
    /// of it empty: a discard at mkfs (the default of all three tools)
    /// would only walk it (`nodiscard`, `-K`). ext*: the inode tables are
    /// written now, not by the kernel's lazy-init thread after the mount
    /// (their zero pages cost the device no memory, and the thread's
    /// writes would come while the filesystem is in use). ext4: no
    /// journal, since the filesystem is made anew at each boot and lives
    /// in memory: a journal would double every metadata write and protect
    /// nothing a power loss does not take anyway; a daemon crash loses no
    /// write (the driver holds the I/O until the next daemon serves it).
    /// ext3 keeps its journal: that is what ext3 is.
    pub fn mkfs_args(self) -> &'static [&'static str] {
        match self {
            FsType::Ext2 => &["-q", "-F", "-E", "nodiscard,lazy_itable_init=0"],
            FsType::Ext3 => &[
                "-q",
                "-F",
                "-E",
                "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
            ],
            FsType::Ext4 => &[
                "-q",
                "-F",
                "-O",
                "^has_journal",
                "-E",
                "nodiscard,lazy_itable_init=0",
            ],
            FsType::Xfs | FsType::Btrfs => &["-q", "-f", "-K"],
        }
    }

    /// The whole `mkfs` command line for `bdev`, for `--dry-run`.
    pub fn mkfs_line(self, bdev: &Path) -> String {
        format!(
            "{} {} {}",
            self.mkfs(),
            self.mkfs_args().join(" "),
            bdev.display()
        )
    }

    /// Fails, naming the package, unless [`FsType::mkfs`] is installed.
    pub fn check_mkfs(self) -> CliResult {
        if program_path(&self.mkfs()).is_some() {
            return Ok(());
        }
        Err(CliError(self.missing_mkfs()))
    }

    /// What a machine without [`FsType::mkfs`] lacks, in one line.
    pub fn missing_mkfs(self) -> String {
        format!(
            "fs-type {} needs {}, which is not installed: install {}",
            self.name(),
            self.mkfs(),
            self.package()
        )
    }
}

/// The default of `fs-type`.
pub const DEFAULT_FS: FsType = FsType::Ext4;

/// The default of `options` for a mount (zram-generator's): discard, so
/// that a deleted file's blocks leave the device's memory at once.
pub const DEFAULT_MOUNT_OPTIONS: &str = "discard";

/// A section's filesystem: where, what, how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// `mount-point`.
    pub point: PathBuf,
    /// `fs-type`.
    pub fs: FsType,
    /// `options`: mount options, as in fstab (may be empty).
    pub options: String,
}

/// `mount-point` checked: absolute, not `/`, no `.` or `..`, no control
/// character; trailing and doubled slashes dropped (systemd names the
/// mount unit after the path, and refuses a path that is not plain).
pub fn mount_point(text: &str) -> Result<PathBuf, String> {
    let p = Path::new(text);
    let plain = !text.split('/').any(|s| s == "." || s == "..");
    if text.chars().any(char::is_control) || !p.is_absolute() || !plain {
        return Err(format!(
            "'{}' is not a plain absolute path (such as /var/tmp/zblk)",
            super::base::escape_controls(text)
        ));
    }
    let clean: PathBuf = p.components().collect();
    if clean == Path::new("/") {
        return Err("/ cannot be a zblk filesystem: the root is mounted before zblk runs".into());
    }
    Ok(clean)
}

/// `options` of a mount checked: fstab's comma-separated words, which
/// have no blank or control character (a unit's `Options=` and
/// `mount -o` take them as they are).
pub fn mount_options(text: &str) -> Result<String, String> {
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "mount options '{}' hold a blank or control character: write them as in fstab, \
             comma-separated (\"discard,noatime\")",
            super::base::escape_controls(text)
        ));
    }
    Ok(text.to_string())
}

/// Formats `bdev` as `fs`.
pub fn make_fs(bdev: &Path, fs: FsType) -> CliResult {
    let mut args: Vec<&str> = fs.mkfs_args().to_vec();
    let dev = bdev.to_string_lossy();
    args.push(&dev);
    sys::run_tool(&fs.mkfs(), &args)
}

/// Mounts `bdev` on `m.point` (made if missing, as systemd does).
pub fn mount(bdev: &Path, m: &Mount) -> CliResult {
    std::fs::create_dir_all(&m.point)
        .map_err(|e| CliError(format!("cannot create {}: {e}", m.point.display())))?;
    let (dev, point) = (bdev.to_string_lossy(), m.point.to_string_lossy());
    let mut args = vec!["-t", m.fs.name()];
    if !m.options.is_empty() {
        args.extend(["-o", &m.options]);
    }
    args.extend([&*dev, &*point]);
    sys::run_tool("mount", &args)
}

/// Unmounts every mount of `bdev`, the last made first (the kernel's
/// table lists them in the order made); says which. A mount that will
/// not go (files open) is an error: the device stays.
pub fn unmount_all(bdev: &Path) -> CliResult {
    for point in mounts_of(bdev).iter().rev() {
        sys::run_tool("umount", &[point])
            .map_err(|e| CliError(format!("{e}; {} kept", bdev.display())))?;
        println!("unmounted {} from {point}", bdev.display());
    }
    Ok(())
}

/// The mount table of this process's mount namespace, as lsblk reads it.
const MOUNTINFO: &str = "/proc/self/mountinfo";

/// Where `bdev` is mounted now, in the order mounted (none when the
/// table cannot be read).
pub fn mounts_of(bdev: &Path) -> Vec<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let table = std::fs::read_to_string(MOUNTINFO).unwrap_or_default();
    let devno = std::fs::metadata(bdev)
        .ok()
        .filter(|m| m.file_type().is_block_device())
        .map(|m| format!("{}:{}", libc::major(m.rdev()), libc::minor(m.rdev())));
    mount_points(&table, &bdev.to_string_lossy(), devno.as_deref())
}

/// The mount points of a block device in a mountinfo table (proc(5)),
/// their `\040`-style escapes undone: the lines of its device number
/// `devno` (`MAJOR:MINOR`), or of its path `dev` as the mount's source
/// (a btrfs mount shows a device number of its own).
fn mount_points(mountinfo: &str, dev: &str, devno: Option<&str>) -> Vec<String> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            // Optional fields (`shared:N`, ...) come between the options
            // (field 6) and the `-` before the type and the source.
            let sep = 6 + f.get(6..)?.iter().position(|w| *w == "-")?;
            let source = f.get(sep + 2).map(|s| unescape_octal(s));
            let ours = devno.is_some_and(|n| f[2] == n) || source.as_deref() == Some(dev);
            ours.then(|| unescape_octal(f[4]))
        })
        .collect()
}

/// The kernel's mount table writes a blank, tab, newline or backslash of
/// a path as `\` and three octal digits.
fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let digits = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], digits) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where `prog` is: the first directory of `PATH` that has it, then the
/// sbin directories, which a user's `PATH` may lack.
pub fn program_path(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(prog))
        .find(|p| is_executable(p))
}

/// Whether `p` is a file someone may run.
fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fs_types_and_their_mkfs() {
        assert_eq!(FsType::parse("ext4"), Ok(FsType::Ext4));
        assert_eq!(FsType::parse("btrfs"), Ok(FsType::Btrfs));
        assert_eq!(
            FsType::parse("zfs").unwrap_err(),
            "unknown fs-type 'zfs': one of ext2, ext3, ext4, xfs, btrfs"
        );
        assert_eq!(
            FsType::Ext4.mkfs_line(Path::new("/dev/ublkb1")),
            "mkfs.ext4 -q -F -O ^has_journal -E nodiscard,lazy_itable_init=0 /dev/ublkb1"
        );
        assert_eq!(FsType::Xfs.package(), "xfsprogs");
        assert_eq!(
            FsType::Btrfs.missing_mkfs(),
            "fs-type btrfs needs mkfs.btrfs, which is not installed: install btrfs-progs"
        );
    }

    #[test]
    fn a_mount_point_is_a_plain_absolute_path() {
        assert_eq!(mount_point("/mnt/zblk"), Ok(PathBuf::from("/mnt/zblk")));
        assert_eq!(mount_point("/var//tmp/"), Ok(PathBuf::from("/var/tmp")));
        for bad in ["mnt", "", "/mnt/../etc", "/mnt/./x", "/mnt/.", "/mnt/\nx"] {
            let e = mount_point(bad).unwrap_err();
            assert!(e.contains("not a plain absolute path"), "{bad:?}: {e}");
            assert!(!e.contains('\n'), "{e:?}");
        }
        assert!(mount_point("/").unwrap_err().starts_with("/ cannot be"));
        assert_eq!(
            mount_options("discard,noatime"),
            Ok("discard,noatime".into())
        );
        assert_eq!(mount_options(""), Ok(String::new()));
        assert!(mount_options("discard, noatime").is_err());
    }

    #[test]
    fn the_mount_table_is_read_by_device() {
        let table = "22 27 0:21 / /proc rw,relatime - proc proc rw\n\
                     27 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n\
                     40 27 259:1 / /mnt/zblk\\040scratch rw shared:20 - ext4 /dev/ublkb1 rw\n\
                     41 27 259:10 / /mnt/other rw - ext4 /dev/ublkb10 rw\n\
                     42 27 259:1 / /srv/a\\134b rw master:3 shared:4 - xfs /dev/ublkb1 rw\n\
                     43 27 0:45 / /srv/btr rw - btrfs /dev/ublkb1 rw\n\
                     44 27 259:1 / /via/link rw - ext4 /dev/disk/by-id/z rw\n\
                     45 27 0:46 / /srv/sp\\040ace rw - btrfs /dev/ublkb\\0402 rw\n";
        let points = |dev, devno| mount_points(table, dev, devno);
        assert_eq!(
            points("/dev/ublkb1", Some("259:1")),
            ["/mnt/zblk scratch", "/srv/a\\b", "/srv/btr", "/via/link"]
        );
        // Without its number (no such node here), by source alone: a
        // mount through another name of the node is not seen then.
        assert_eq!(
            points("/dev/ublkb1", None),
            ["/mnt/zblk scratch", "/srv/a\\b", "/srv/btr"]
        );
        assert_eq!(points("/dev/ublkb 2", None), ["/srv/sp ace"]);
        assert!(points("/dev/ublkb2", Some("259:2")).is_empty());
        // A line cut short is no mount.
        assert!(
            mount_points("40 27 259:1 / /m rw shared:1", "/dev/ublkb1", Some("259:1")).is_empty()
        );
        assert_eq!(unescape_octal("a\\01"), "a\\01", "too short: kept");
    }

    #[test]
    fn programs_are_found_on_the_path() {
        assert!(program_path("sh").is_some());
        assert!(program_path("no-such-program-zblk").is_none());
    }
}
