//! The hidden `zblk generator DIR...`: zblk's systemd generator (what
//! `/usr/lib/systemd/system-generators/zblk-generator` runs at boot and at
//! each `systemctl daemon-reload`, as zram-generator is one for zram).
//!
//! A filesystem must be mounted before `local-fs.target`, and systemd
//! learns what to mount there from units it reads before it starts
//! anything: so for each section with a `mount-point`, the generator
//! writes into DIR
//! - `WHERE.mount` (the path escaped as `systemd-escape --path` does):
//!   `What=/dev/ublkbN`, `Where=`, `Type=`, `Options=`, `Wants=` and
//!   `After=zblk@N.service`, `Before=local-fs.target`, and a link in
//!   `local-fs.target.wants/` that pulls it in at boot;
//! - `zblk@N.service.d/zblk-generator.conf`: its description, and
//!   `After=zblk-setup.service`;
//! - `dev-ublkbN.device.d/zblk-generator.conf`: `After=zblk@N.service`,
//!   so that the mount's wait for the device starts when the device is
//!   made ([`device_drop_in`]).
//!
//! `zblk@N.service` (`zblk setup --id N --foreground`) makes the device,
//! formats it and only then says `READY=1`, so the mount comes after the
//! `mkfs`. Stopping goes the other way: the mount is stopped (unmounted)
//! before `zblk@N.service`, whose `ExecStop` deletes the device, and that
//! before `zblk-setup.service`'s stop (`zblk del --all`) begins.
//!
//! `Wants=`, not `Requires=`: systemd 252 (Debian 12) restarts a service
//! that crashed by a restart job, which a `Requires=` would carry to the
//! mount: an unmount while no daemon serves the device, whose superblock
//! write the driver holds until the next daemon, which waits for that
//! unmount. With `Wants=` the mount stays through the daemon's restart,
//! its I/O held and then served by the daemon that took the device over.
//! A stop of `zblk@N.service` alone unmounts first all the same: its
//! `ExecStop` (`zblk setup --id N --stop`) does. Swap
//! sections get nothing here: `zblk-setup.service` or an enabled
//! `zblk@N.service` brings them up as before.
//!
//! A section whose idle policy is limited to or excludes cgroups
//! (`policy-cgroups`, `policy-exclude-cgroups`) gets
//! `zblk-policy-ublkbN.service` (`zblk setup --id N --policy`, a oneshot,
//! root) and `zblk-policy-ublkbN.timer`, which runs it every
//! [`POLICY_PERIOD_S`] seconds, pulled in by a link in
//! `timers.target.wants/`: the daemon cannot read page tables, so its own
//! policy is off for such a section and this root process acts for it
//! (`super::cgroup_policy`).
//!
//! Sections skipped on this machine (`host-memory-limit`) and a boot with
//! `zblk.disable` get no units: a mount unit would wait for a device that
//! never comes.

use super::conf::{self, Entry};
use super::fs::Mount;
use super::{
    base::{CliError, CliResult},
    setup,
};
use std::path::{Path, PathBuf};

/// What the generator writes: a path under its directory and either a
/// unit file's text or a symbolic link's target.
#[derive(Debug, PartialEq, Eq)]
pub struct GenFile {
    /// Relative to the generator's directory.
    pub path: PathBuf,
    /// The file.
    pub content: Content,
}

/// A generated file's content.
#[derive(Debug, PartialEq, Eq)]
pub enum Content {
    /// A unit or a drop-in.
    Text(String),
    /// A symbolic link to this target.
    Link(String),
}

/// `zblk generator DIR`: the units of the filesystems of the default
/// configuration (and its drop-ins) into `dir`.
pub fn generator(dir: &Path) -> CliResult {
    if setup::disabled(Path::new(setup::CMDLINE))? {
        return Ok(());
    }
    let file = Path::new(super::args::DEFAULT_CONF_PATH);
    let drop_ins = conf::default_drop_ins();
    let ram_mb = conf::ram_mb()?;
    let entries = conf::read(file, Some(&drop_ins), ram_mb)?.entries;
    let made: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.skip_reason(ram_mb).is_none())
        .collect();
    for f in units(&made, file) {
        write(dir, &f)?;
    }
    Ok(())
}

/// Seconds between two rounds of a cgroup-limited idle policy.
pub const POLICY_PERIOD_S: u64 = 60;

/// The files for every entry with a mount-point or a cgroup-limited
/// idle policy, `source` the file named as their origin.
pub fn units(entries: &[&Entry], source: &Path) -> Vec<GenFile> {
    let mut files = Vec::new();
    for e in entries {
        if e.policy.is_some() {
            files.extend(policy_units(&e.name, e.add.dev.id.unwrap_or(0), source));
        }
        let Some(m) = &e.mount else { continue };
        let id = e.add.dev.id.unwrap_or(0);
        let name = mount_unit_name(&m.point);
        files.push(GenFile {
            path: PathBuf::from(&name),
            content: Content::Text(mount_unit(&e.name, id, m, source)),
        });
        files.push(GenFile {
            path: Path::new("local-fs.target.wants").join(&name),
            content: Content::Link(format!("../{name}")),
        });
        files.push(GenFile {
            path: PathBuf::from(format!("zblk@{id}.service.d/zblk-generator.conf")),
            content: Content::Text(service_drop_in(id, m)),
        });
        files.push(GenFile {
            path: PathBuf::from(format!("dev-ublkb{id}.device.d/zblk-generator.conf")),
            content: Content::Text(device_drop_in(id)),
        });
    }
    files
}

/// The service, the timer and the timer's link of section `sect`'s
/// (device `id`'s) cgroup-limited idle policy.
fn policy_units(sect: &str, id: u32, source: &Path) -> Vec<GenFile> {
    let name = format!("zblk-policy-ublkb{id}");
    let service = format!(
        "# Written by zblk-generator from [{sect}] of {}: its idle policy by cgroup.\n\
         [Unit]\n\
         Description=zblk idle policy of /dev/ublkb{id} by cgroup\n\
         After=zblk@{id}.service zblk-setup.service\n\
         \n\
         [Service]\n\
         Type=oneshot\n\
         ExecStart=/usr/bin/zblk setup --id {id} --policy\n",
        specifiers(&source.display().to_string())
    );
    let timer = format!(
        "# Written by zblk-generator from [{sect}] of {}.\n\
         [Unit]\n\
         Description=zblk idle policy of /dev/ublkb{id} by cgroup, every {POLICY_PERIOD_S} s\n\
         \n\
         [Timer]\n\
         OnActiveSec={POLICY_PERIOD_S}\n\
         OnUnitInactiveSec={POLICY_PERIOD_S}\n",
        specifiers(&source.display().to_string())
    );
    vec![
        GenFile {
            path: PathBuf::from(format!("{name}.service")),
            content: Content::Text(service),
        },
        GenFile {
            path: PathBuf::from(format!("{name}.timer")),
            content: Content::Text(timer),
        },
        GenFile {
            path: Path::new("timers.target.wants").join(format!("{name}.timer")),
            content: Content::Link(format!("../{name}.timer")),
        },
    ]
}

/// The mount unit of section `sect`'s filesystem.
fn mount_unit(sect: &str, id: u32, m: &Mount, source: &Path) -> String {
    let point = specifiers(&m.point.to_string_lossy());
    let src = specifiers(&source.to_string_lossy());
    format!(
        "# Written by zblk-generator from [{sect}] of {src}.\n\
         # zblk@{id}.service makes /dev/ublkb{id} and formats it before it is\n\
         # ready; this unit mounts it, and unmounts it before that unit stops\n\
         # (Wants=: a restart of its crashed daemon leaves the mount alone).\n\
         \n\
         [Unit]\n\
         Description=zblk filesystem on {point}\n\
         Documentation=man:zblk-setup(1)\n\
         SourcePath={src}\n\
         Wants=zblk@{id}.service\n\
         After=zblk@{id}.service\n\
         Before=local-fs.target\n\
         \n\
         [Mount]\n\
         What=/dev/ublkb{id}\n\
         Where={point}\n\
         Type={}\n\
         Options={}\n",
        m.fs.name(),
        specifiers(&m.options),
    )
}

/// The drop-in of `zblk@N.service` for a filesystem's device.
fn service_drop_in(id: u32, m: &Mount) -> String {
    let point = specifiers(&m.point.to_string_lossy());
    format!(
        "# Written by zblk-generator: /dev/ublkb{id} holds the filesystem on {point}.\n\
         [Unit]\n\
         Description=zblk filesystem device /dev/ublkb{id} for {point}\n\
         # Stopped (its device deleted) before zblk-setup.service's stop, which\n\
         # deletes every zblk device left (zblk del --all), begins.\n\
         After=zblk-setup.service\n"
    )
}

/// The drop-in of the device unit the mount waits for (systemd gives a
/// mount of `/dev/ublkbN` a dependency on `dev-ublkbN.device`): the
/// device appears only when `zblk@N.service` makes it, and the wait for
/// it (systemd's device timeout, 90 s) would otherwise start with the
/// boot's transaction, running out on a slow boot before that unit even
/// starts. Ordered after it, the wait starts once its start is done.
fn device_drop_in(id: u32) -> String {
    format!(
        "# Written by zblk-generator: zblk@{id}.service makes /dev/ublkb{id}.\n\
         [Unit]\n\
         After=zblk@{id}.service\n"
    )
}

/// `%` is where systemd expands specifiers in a unit's values: written
/// `%%` it stays a `%`.
fn specifiers(value: &str) -> String {
    value.replace('%', "%%")
}

/// The name of the mount unit of `point`, as `systemd-escape --path
/// --suffix=mount` makes it: the slashes between the parts become `-`;
/// a byte other than an ASCII letter, digit, `:`, `_` or `.` (or a `.`
/// that starts the name) becomes `\xNN`.
pub fn mount_unit_name(point: &Path) -> String {
    let text = point.to_string_lossy();
    let trimmed = text.trim_matches('/');
    let mut name = String::new();
    for (i, b) in trimmed.bytes().enumerate() {
        match b {
            b'/' => name.push('-'),
            b'.' if i == 0 => name.push_str("\\x2e"),
            b if b.is_ascii_alphanumeric() || b":_.".contains(&b) => name.push(b as char),
            b => name.push_str(&format!("\\x{b:02x}")),
        }
    }
    name + ".mount"
}

/// Writes one generated file under `dir`.
fn write(dir: &Path, f: &GenFile) -> CliResult {
    let path = dir.join(&f.path);
    let io = |e: std::io::Error| CliError(format!("cannot write {}: {e}", path.display()));
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    match &f.content {
        Content::Text(text) => std::fs::write(&path, text).map_err(io),
        Content::Link(target) => std::os::unix::fs::symlink(target, &path).map_err(io),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONF: &str = "[ublkb0]\nsize = 1024\n\
                        [ublkb1]\nsize = 256\nmount-point = \"/mnt/zblk-scratch\"\n\
                        [ublkb2]\nsize = 64\nmount-point = \"/var/tmp/50%\"\n\
                        fs-type = \"xfs\"\noptions = \"\"\n";

    fn made() -> Vec<GenFile> {
        let e = conf::parse(Path::new("/etc/zblk/zblk.conf"), CONF, 4096.0).unwrap();
        let refs: Vec<&Entry> = e.iter().collect();
        units(&refs, Path::new("/etc/zblk/zblk.conf"))
    }

    #[test]
    fn a_filesystem_gets_a_mount_unit_a_wants_link_and_a_drop_in() {
        let files = made();
        let paths: Vec<String> = files.iter().map(|f| f.path.display().to_string()).collect();
        // The swap section [ublkb0] gets nothing.
        assert_eq!(
            paths,
            [
                "mnt-zblk\\x2dscratch.mount",
                "local-fs.target.wants/mnt-zblk\\x2dscratch.mount",
                "zblk@1.service.d/zblk-generator.conf",
                "dev-ublkb1.device.d/zblk-generator.conf",
                "var-tmp-50\\x25.mount",
                "local-fs.target.wants/var-tmp-50\\x25.mount",
                "zblk@2.service.d/zblk-generator.conf",
                "dev-ublkb2.device.d/zblk-generator.conf",
            ]
        );
        assert_eq!(
            files[1].content,
            Content::Link("../mnt-zblk\\x2dscratch.mount".into())
        );
        let Content::Text(unit) = &files[0].content else {
            panic!("not a unit")
        };
        assert_eq!(
            unit,
            "# Written by zblk-generator from [ublkb1] of /etc/zblk/zblk.conf.\n\
             # zblk@1.service makes /dev/ublkb1 and formats it before it is\n\
             # ready; this unit mounts it, and unmounts it before that unit stops\n\
             # (Wants=: a restart of its crashed daemon leaves the mount alone).\n\
             \n\
             [Unit]\n\
             Description=zblk filesystem on /mnt/zblk-scratch\n\
             Documentation=man:zblk-setup(1)\n\
             SourcePath=/etc/zblk/zblk.conf\n\
             Wants=zblk@1.service\n\
             After=zblk@1.service\n\
             Before=local-fs.target\n\
             \n\
             [Mount]\n\
             What=/dev/ublkb1\n\
             Where=/mnt/zblk-scratch\n\
             Type=ext4\n\
             Options=discard\n"
        );
        let Content::Text(drop_in) = &files[2].content else {
            panic!("not a drop-in")
        };
        assert!(
            drop_in.contains("\nAfter=zblk-setup.service\n"),
            "{drop_in}"
        );
        assert!(drop_in
            .contains("Description=zblk filesystem device /dev/ublkb1 for /mnt/zblk-scratch\n"));
    }

    #[test]
    fn values_keep_a_percent_sign_and_take_the_fs_type_and_options_written() {
        let Content::Text(device) = &made()[3].content else {
            panic!("not a drop-in")
        };
        assert!(
            device.ends_with("[Unit]\nAfter=zblk@1.service\n"),
            "{device}"
        );
        let Content::Text(unit) = &made()[4].content else {
            panic!("not a unit")
        };
        assert!(unit.contains("\nWhere=/var/tmp/50%%\n"), "{unit}");
        assert!(unit.contains("\nType=xfs\nOptions=\n"), "{unit}");
        assert!(unit.contains("Wants=zblk@2.service\n"), "{unit}");
    }

    #[test]
    fn a_policy_by_cgroup_gets_a_service_and_a_timer() {
        let conf = "[ublkb3]\nsize = 64\nbacking-dev = \"/dev/loop0\"\n\
                    writeback-idle-after = 3600\n\
                    policy-exclude-cgroups = [\"/user.slice\"]\n";
        let e = conf::parse(Path::new("/etc/zblk/zblk.conf"), conf, 4096.0).unwrap();
        let files = units(
            &e.iter().collect::<Vec<_>>(),
            Path::new("/etc/zblk/zblk.conf"),
        );
        let paths: Vec<String> = files.iter().map(|f| f.path.display().to_string()).collect();
        assert_eq!(
            paths,
            [
                "zblk-policy-ublkb3.service",
                "zblk-policy-ublkb3.timer",
                "timers.target.wants/zblk-policy-ublkb3.timer",
            ]
        );
        let Content::Text(service) = &files[0].content else {
            panic!()
        };
        assert!(service.contains("\nType=oneshot\n"), "{service}");
        assert!(
            service.contains("\nExecStart=/usr/bin/zblk setup --id 3 --policy\n"),
            "{service}"
        );
        let Content::Text(timer) = &files[1].content else {
            panic!()
        };
        assert!(timer.contains("\nOnUnitInactiveSec=60\n"), "{timer}");
        assert_eq!(
            files[2].content,
            Content::Link("../zblk-policy-ublkb3.timer".into())
        );
    }

    #[test]
    fn mount_unit_names_are_systemd_escape_s() {
        let name = |p: &str| mount_unit_name(Path::new(p));
        assert_eq!(name("/var/tmp/zblk"), "var-tmp-zblk.mount");
        assert_eq!(name("/tmp"), "tmp.mount");
        assert_eq!(name("/mnt/a b-c"), "mnt-a\\x20b\\x2dc.mount");
        assert_eq!(name("/.hidden/x.y"), "\\x2ehidden-x.y.mount");
        assert_eq!(name("/srv/ü"), "srv-\\xc3\\xbc.mount");
    }

    #[test]
    fn the_files_are_written_under_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        for f in made() {
            write(dir.path(), &f).unwrap();
        }
        let link = dir
            .path()
            .join("local-fs.target.wants/mnt-zblk\\x2dscratch.mount");
        let unit = std::fs::read_to_string(&link).unwrap();
        assert!(unit.contains("Where=/mnt/zblk-scratch\n"));
        assert!(dir
            .path()
            .join("zblk@2.service.d/zblk-generator.conf")
            .is_file());
    }
}
