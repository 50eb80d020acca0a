//! `zblk setup`: brings up the devices of the configuration file
//! ([`super::conf`]) through `zblk add --swap`'s code, leaving alone those
//! already served, one line per device: swap, or a filesystem formatted
//! and mounted on its `mount-point`; or, with `--id N --foreground`,
//! serves one of them in this process (systemd's `zblk@N.service`,
//! [`super::unit`]).

use super::args::SetupArgs;
use super::conf::{self, Entry};
use super::{
    add,
    base::{CliError, CliResult},
    fs, sys, unit,
};
use std::path::{Path, PathBuf};

/// Where the kernel command line is read from.
pub(super) const CMDLINE: &str = "/proc/cmdline";

/// `zblk setup [--config F] [--dry-run] [--id N [--foreground]]`.
pub fn setup(a: SetupArgs) -> CliResult {
    // Stopping stays possible: a device made before the flag was set
    // must still come down cleanly.
    if !a.stop && disabled(Path::new(CMDLINE))? {
        let line = disabled_line(a.dry_run);
        println!("{line}");
        if a.foreground {
            ready_without_device(&line);
        }
        return Ok(());
    }
    let ram_mb = conf::ram_mb()?;
    let file = a.config_file();
    let drop_ins = match a.config {
        Some(_) => None,
        None => Some(conf::default_drop_ins()),
    };
    let config = conf::read(file, drop_ins.as_deref(), ram_mb)?;
    let read = files_read(file, &config.files);
    let entries = select(config.entries, a.id, &read)?;
    let (entries, left) = swap_only(entries, a.swap_only, a.dry_run);
    if a.dry_run {
        if let Some(line) = files_line(file, &config.files) {
            println!("{line}");
        }
        let lines = dry_run_lines(&entries, ram_mb, add::is_live);
        for line in lines.iter().chain(&left).chain(&missing_mkfs(&entries)) {
            println!("{line}");
        }
        return Ok(());
    }
    for line in &left {
        println!("{line}");
    }
    if a.foreground {
        return foreground(entries, ram_mb);
    }
    if a.stop {
        return match entries.first() {
            Some(e) => unit::stop(e.add.dev.id.unwrap_or(0)),
            None => Ok(()),
        };
    }
    if a.policy {
        return match entries.first() {
            Some(e) => policy_round(e),
            None => Ok(()),
        };
    }
    sys::check_driver()?;
    sys::check_root("zblk setup")?;
    if entries.is_empty() {
        println!("{read}: no devices");
    }
    bring_up_all(&entries, ram_mb)
}

/// `--id N --policy`: a round of the entry's cgroup-limited idle policy.
fn policy_round(e: &Entry) -> CliResult {
    let id = e.add.dev.id.unwrap_or(0);
    match &e.policy {
        Some(p) => super::cgroup_policy::round(id, p),
        None => Err(CliError(format!(
            "[{}] has no policy-cgroups or policy-exclude-cgroups: \
             its idle policy, if any, is the daemon's",
            e.name
        ))),
    }
}

/// `--id N --foreground`: serves the one entry, unless it is skipped.
fn foreground(entries: Vec<Entry>, ram_mb: f64) -> CliResult {
    let Some(e) = entries.into_iter().next() else {
        return Ok(());
    };
    // A device that exists is served whatever the file says now: a
    // restart after a crash or an upgrade must take its pages over (the
    // swap's I/O waits on it), even if a section gained a
    // host-memory-limit or the machine more memory since boot.
    let id = e.add.dev.id.unwrap_or(0);
    match skip_line(&e, ram_mb) {
        Some(line) if zblk_ublk::device::driver_state(id) == "gone" => {
            println!("{line}");
            ready_without_device(&line);
            Ok(())
        }
        _ => unit::serve(e),
    }
}

/// Tells systemd the unit started (`zblk@N.service` is `Type=notify`)
/// although it makes no device: a main process that exits 0 before
/// `READY=1` is a failed start there, which `Restart=on-failure` would
/// repeat until the start limit. Outside systemd this does nothing.
fn ready_without_device(status: &str) {
    if let Err(e) = zblk_ublk::notify::ready(status) {
        eprintln!("zblk setup: cannot tell systemd the unit is up: {e}");
    }
}

/// Brings up every entry not skipped, one line each; an error if any
/// failed (after trying the others).
fn bring_up_all(entries: &[Entry], ram_mb: f64) -> CliResult {
    let mut failed = 0;
    for e in entries {
        if let Some(line) = skip_line(e, ram_mb) {
            println!("{line}");
            continue;
        }
        match bring_up(e) {
            Ok(line) => println!("{line}"),
            Err(err) => {
                eprintln!("zblk: {}: {err}", e.name);
                failed += 1;
            }
        }
    }
    match failed {
        0 => Ok(()),
        n => Err(CliError(format!(
            "{n} of {} devices not set up",
            entries.len()
        ))),
    }
}

/// Whether the kernel command line in `file` says `zblk.disable` (as
/// zram-generator's `systemd.zram=0`); a file that is not there (no
/// /proc in a container) says nothing.
pub(super) fn disabled(file: &Path) -> Result<bool, CliError> {
    match std::fs::read_to_string(file) {
        Ok(text) => {
            cmdline_disables(&text).map_err(|e| CliError(format!("{}: {e}", file.display())))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(CliError(format!("cannot read {}: {e}", file.display()))),
    }
}

/// `zblk.disable` or `zblk.disable=BOOL` in a kernel command line, the
/// last one winning as the kernel's own parameters do.
fn cmdline_disables(cmdline: &str) -> Result<bool, String> {
    let mut off = false;
    for word in cmdline.split_whitespace() {
        if word == DISABLE {
            off = true;
        } else if let Some(v) = word.strip_prefix(DISABLE).and_then(|w| w.strip_prefix('=')) {
            off = match v {
                "1" | "yes" | "true" | "on" => true,
                "0" | "no" | "false" | "off" => false,
                _ => {
                    return Err(format!(
                        "{DISABLE}: '{}' is not 1 or 0: write zblk.disable or zblk.disable=0",
                        super::base::escape_controls(v)
                    ))
                }
            };
        }
    }
    Ok(off)
}

/// The kernel parameter that turns `zblk setup` off.
const DISABLE: &str = "zblk.disable";

/// The one line `zblk setup` prints when the kernel command line turns
/// it off.
fn disabled_line(dry_run: bool) -> String {
    let what = if dry_run {
        "would do nothing"
    } else {
        "nothing done"
    };
    format!("{DISABLE} is on the kernel command line ({CMDLINE}): {what}")
}

/// The entries to act on: all, or the one section `ublkbN` of `--id N`;
/// `read` names the files they came from ([`files_read`]).
fn select(entries: Vec<Entry>, id: Option<u32>, read: &str) -> Result<Vec<Entry>, CliError> {
    let Some(id) = id else {
        return Ok(entries);
    };
    let one: Vec<Entry> = entries
        .into_iter()
        .filter(|e| e.add.dev.id == Some(id))
        .collect();
    if one.is_empty() {
        return Err(CliError(format!("{read}: no section [ublkb{id}]")));
    }
    Ok(one)
}

/// The files a configuration was read from, in words, for messages that
/// name them: `F`, `F, then D1, D2`, or that there were none (`file`
/// missing and no drop-in).
fn files_read(file: &Path, files: &[PathBuf]) -> String {
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    match names.split_first() {
        None => format!("no {} and no drop-in", file.display()),
        Some((first, [])) => first.clone(),
        Some((first, rest)) => format!("{first}, then {}", rest.join(", ")),
    }
}

/// With `--swap-only`, the entries that are swap, and a line for each
/// filesystem left out: zblk-setup.service runs so, leaving the sections
/// with a mount-point to the units zblk's generator writes for them.
fn swap_only(entries: Vec<Entry>, only: bool, dry_run: bool) -> (Vec<Entry>, Vec<String>) {
    if !only {
        return (entries, Vec::new());
    }
    let verb = if dry_run { "would leave" } else { "left" };
    let (fs, swap): (Vec<Entry>, Vec<Entry>) = entries.into_iter().partition(|e| e.mount.is_some());
    let lines = fs
        .iter()
        .map(|e| {
            let id = e.add.dev.id.unwrap_or(0);
            format!(
                "{}: a filesystem: {verb} /dev/ublkb{id} to zblk@{id}.service and its mount unit \
                 (--swap-only)",
                e.name
            )
        })
        .collect();
    (swap, lines)
}

/// A line for each filesystem whose `mkfs` this machine lacks.
fn missing_mkfs(entries: &[Entry]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|e| e.mount.as_ref().map(|m| (e, m.fs)))
        .filter(|(_, t)| fs::program_path(&t.mkfs()).is_none())
        .map(|(e, t)| format!("{}: {}", e.name, t.missing_mkfs()))
        .collect()
}

/// Creates one device unless it is live already (a filesystem: formats
/// and mounts it); says what it did.
fn bring_up(e: &Entry) -> Result<String, CliError> {
    let id = e.add.dev.id.unwrap_or(0);
    if add::is_live(id) {
        return Ok(format!(
            "{}: /dev/ublkb{id} is live already, left alone",
            e.name
        ));
    }
    if let Some(m) = &e.mount {
        m.fs.check_mkfs()?;
    }
    let info = add::start(&e.add, &unit::format(e))?;
    if let Some(m) = &e.mount {
        fs::mount(Path::new(&info.path), m).map_err(|err| add::remove(id, err))?;
    }
    Ok(format!(
        "{}: created {}: {}",
        e.name,
        info.path,
        settings(e)
    ))
}

/// For `--dry-run`, the files read in order when a drop-in was.
fn files_line(file: &Path, files: &[PathBuf]) -> Option<String> {
    if files.iter().all(|f| f == file) {
        return None;
    }
    Some(format!(
        "reading {} (later keys win)",
        files_read(file, files)
    ))
}

/// The line saying an entry makes no device on this machine, if so.
fn skip_line(e: &Entry, ram_mb: f64) -> Option<String> {
    let why = e.skip_reason(ram_mb)?;
    let id = e.add.dev.id.unwrap_or(0);
    Some(format!("{}: no /dev/ublkb{id}: {why}", e.name))
}

/// What `--dry-run` prints: one line per entry, on a machine of `ram_mb`
/// MB, `is_live` saying which devices are served already.
pub fn dry_run_lines(entries: &[Entry], ram_mb: f64, is_live: impl Fn(u32) -> bool) -> Vec<String> {
    entries
        .iter()
        .map(|e| {
            let id = e.add.dev.id.unwrap_or(0);
            if let Some(line) = skip_line(e, ram_mb) {
                line
            } else if is_live(id) {
                format!("{}: /dev/ublkb{id} is live: would leave it alone", e.name)
            } else {
                format!("{}: would create /dev/ublkb{id}: {}", e.name, settings(e))
            }
        })
        .collect()
}

/// An entry's settings in words, the size with its expression.
fn settings(e: &Entry) -> String {
    let d = &e.add.dev;
    let mem_limit = match (d.mem_limit, &e.mem_limit_expr) {
        (0, None) => "none".to_string(),
        (0, Some(expr)) => format!("{expr} = 0 (none)"),
        (n, None) => format!("{n} bytes"),
        (n, Some(expr)) => format!("{expr} = {} MiB ({n} bytes)", n >> 20),
    };
    let id = d.id.unwrap_or(0);
    format!(
        "size {} = {} MiB ({} bytes), {}, {}, {} pages a group, mem-limit {mem_limit}, \
         recovery {}; {}",
        e.size_expr,
        d.size >> 20,
        d.size,
        d.engine.algo,
        d.engine.mode,
        d.engine.group_pages,
        if d.no_recovery { "off" } else { "on" },
        purpose(e, id),
    )
}

/// What the device is for, in words: swap, or the filesystem's mkfs and
/// mount.
fn purpose(e: &Entry, id: u32) -> String {
    let Some(m) = &e.mount else {
        return format!("swap at priority {} with {}", e.add.priority, e.discard);
    };
    let bdev = zblk_ublk::paths::bdev_path(id);
    let options = match m.options.as_str() {
        "" => String::new(),
        o => format!(" -o {o}"),
    };
    format!(
        "{}, then mount -t {}{options} {} {}",
        m.fs.mkfs_line(&bdev),
        m.fs.name(),
        bdev.display(),
        m.point.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "[ublkb0]\n\
                       size = \"min(ram / 2, 4096)\"\n\
                       compression-algorithm = \"zstd:3\"\n\
                       [ublkb1]\n\
                       size = \"ram / 4\"\n\
                       mode = \"packed\"\n\
                       mem-limit = \"256M\"\n\
                       swap-priority = 10\n\
                       options = \"\"\n\
                       recovery = false\n";

    #[test]
    fn dry_run_prints_each_device_with_its_evaluated_size() {
        let entries = conf::parse(Path::new("t.conf"), TWO, 6000.0).unwrap();
        let lines = dry_run_lines(&entries, 6000.0, |_| false);
        assert_eq!(
            lines,
            [
                "ublkb0: would create /dev/ublkb0: size min(ram / 2, 4096) = 3000 MiB \
                 (3145728000 bytes), zstd:3, per-page, 8 pages a group, mem-limit none, \
                 recovery on; swap at priority 100 with discard",
                "ublkb1: would create /dev/ublkb1: size ram / 4 = 1500 MiB (1572864000 bytes), \
                 lz4, packed, 8 pages a group, mem-limit 268435456 bytes, recovery off; \
                 swap at priority 10 with no discard",
            ]
        );
        // More RAM: the first device hits its cap of 4096 MB.
        let entries = conf::parse(Path::new("t.conf"), TWO, 65536.0).unwrap();
        let lines = dry_run_lines(&entries, 6000.0, |id| id == 1);
        assert!(
            lines[0].contains("= 4096 MiB (4294967296 bytes)"),
            "{}",
            lines[0]
        );
        assert_eq!(
            lines[1],
            "ublkb1: /dev/ublkb1 is live: would leave it alone"
        );
    }

    #[test]
    fn dry_run_shows_a_mem_limit_expression_evaluated() {
        let text = "[ublkb0]\nsize = 1024\nmem-limit = \"ram / 8\"\n\
                    [ublkb1]\nsize = 1024\nmem-limit = \"ram * 0\"\n";
        let entries = conf::parse(Path::new("t.conf"), text, 8192.0).unwrap();
        let lines = dry_run_lines(&entries, 6000.0, |_| false);
        assert!(
            lines[0].contains("mem-limit ram / 8 = 1024 MiB (1073741824 bytes),"),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].contains("mem-limit ram * 0 = 0 (none),"),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn dry_run_says_why_a_device_is_skipped() {
        let text = "[ublkb0]\nsize = 1024\nhost-memory-limit = 4096\n\
                    [ublkb1]\nsize = 1024\nhost-memory-limit = \"none\"\n";
        let entries = conf::parse(Path::new("t.conf"), text, 8192.0).unwrap();
        let lines = dry_run_lines(&entries, 8192.0, |_| false);
        assert_eq!(
            lines[0],
            "ublkb0: no /dev/ublkb0: this machine's 8192 MB of memory is more than \
             host-memory-limit = 4096"
        );
        assert!(lines[1].starts_with("ublkb1: would create"), "{}", lines[1]);
        let lines = dry_run_lines(&entries, 4096.0, |_| false);
        assert!(lines[0].starts_with("ublkb0: would create"), "{}", lines[0]);
    }

    #[test]
    fn dry_run_shows_a_filesystem_s_mkfs_and_mount() {
        let text = "[ublkb0]\nsize = 64\n\
                    [ublkb1]\nsize = 256\nmount-point = \"/mnt/scratch\"\n\
                    [ublkb2]\nsize = 256\nmount-point = \"/srv/x\"\nfs-type = \"xfs\"\n\
                    options = \"\"\n";
        let entries = conf::parse(Path::new("t.conf"), text, 4096.0).unwrap();
        let lines = dry_run_lines(&entries, 4096.0, |_| false);
        assert!(
            lines[1].ends_with(
                "recovery on; mkfs.ext4 -q -F -O ^has_journal -E nodiscard,lazy_itable_init=0 \
                 /dev/ublkb1, then mount -t ext4 -o discard /dev/ublkb1 /mnt/scratch"
            ),
            "{}",
            lines[1]
        );
        assert!(
            lines[2]
                .ends_with("mkfs.xfs -q -f -K /dev/ublkb2, then mount -t xfs /dev/ublkb2 /srv/x"),
            "{}",
            lines[2]
        );
        // zblk-setup.service's --swap-only leaves the filesystems to their
        // units.
        let (swap, left) = swap_only(entries, true, true);
        assert_eq!(swap.len(), 1);
        assert_eq!(
            left[0],
            "ublkb1: a filesystem: would leave /dev/ublkb1 to zblk@1.service and its mount \
             unit (--swap-only)"
        );
    }

    #[test]
    fn the_kernel_command_line_can_turn_setup_off() {
        let off = |c: &str| cmdline_disables(c);
        assert_eq!(
            off("BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro quiet\n"),
            Ok(false)
        );
        assert_eq!(off("ro zblk.disable quiet\n"), Ok(true));
        assert_eq!(off("zblk.disable=1"), Ok(true));
        assert_eq!(off("zblk.disable=0"), Ok(false));
        // The last one wins, as for the kernel's own parameters.
        assert_eq!(off("zblk.disable zblk.disable=0"), Ok(false));
        assert_eq!(off("zblk.disable=0 zblk.disable"), Ok(true));
        // Another parameter that starts the same is not this one.
        assert_eq!(off("zblk.disabled zblk.disable_x=1"), Ok(false));
        let e = off("zblk.disable=maybe").unwrap_err();
        assert!(e.starts_with("zblk.disable: 'maybe' is not 1 or 0"), "{e}");
    }

    #[test]
    fn the_command_line_is_read_from_the_file_given() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cmdline");
        std::fs::write(&file, "root=/dev/vda1 zblk.disable\n").unwrap();
        assert!(disabled(&file).unwrap());
        std::fs::write(&file, "root=/dev/vda1 zblk.disable=2\n").unwrap();
        let e = disabled(&file).unwrap_err().0;
        assert!(
            e.starts_with(&format!("{}: zblk.disable: ", file.display())),
            "{e}"
        );
        // No such file (no /proc): not disabled.
        assert!(!disabled(&dir.path().join("none")).unwrap());
        assert_eq!(
            disabled_line(true),
            "zblk.disable is on the kernel command line (/proc/cmdline): would do nothing"
        );
    }

    #[test]
    fn dry_run_names_the_drop_ins_in_the_order_read() {
        let main = PathBuf::from("/etc/zblk/zblk.conf");
        assert_eq!(files_line(&main, &[]), None);
        assert_eq!(files_line(&main, std::slice::from_ref(&main)), None);
        let drops = [
            main.clone(),
            PathBuf::from("/usr/lib/zblk/zblk.conf.d/10-a.conf"),
            PathBuf::from("/etc/zblk/zblk.conf.d/20-b.conf"),
        ];
        assert_eq!(
            files_line(&main, &drops).unwrap_or_default(),
            "reading /etc/zblk/zblk.conf, then /usr/lib/zblk/zblk.conf.d/10-a.conf, \
             /etc/zblk/zblk.conf.d/20-b.conf (later keys win)"
        );
        // No main file: the drop-ins alone.
        assert_eq!(
            files_line(&main, &drops[2..]).unwrap_or_default(),
            "reading /etc/zblk/zblk.conf.d/20-b.conf (later keys win)"
        );
    }

    #[test]
    fn one_device_is_chosen_by_id() {
        let f = Path::new("t.conf");
        let read = files_read(f, &[f.to_path_buf()]);
        let pick = |id| select(conf::parse(f, TWO, 6000.0).unwrap(), id, &read);
        assert_eq!(pick(None).unwrap().len(), 2);
        let one = pick(Some(1)).unwrap();
        assert_eq!((one.len(), one[0].name.as_str()), (1, "ublkb1"));
        assert_eq!(pick(Some(7)).unwrap_err().0, "t.conf: no section [ublkb7]");
    }

    /// The message of a missing section names every file read.
    #[test]
    fn a_missing_section_names_the_files_read() {
        let main = Path::new("/etc/zblk/zblk.conf");
        let drop = PathBuf::from("/etc/zblk/zblk.conf.d/50-more.conf");
        let e = |files: &[PathBuf]| select(Vec::new(), Some(3), &files_read(main, files));
        assert_eq!(
            e(&[main.to_path_buf(), drop.clone()]).unwrap_err().0,
            "/etc/zblk/zblk.conf, then /etc/zblk/zblk.conf.d/50-more.conf: no section [ublkb3]"
        );
        assert_eq!(
            e(&[drop]).unwrap_err().0,
            "/etc/zblk/zblk.conf.d/50-more.conf: no section [ublkb3]"
        );
        assert_eq!(
            e(&[]).unwrap_err().0,
            "no /etc/zblk/zblk.conf and no drop-in: no section [ublkb3]"
        );
    }
}
