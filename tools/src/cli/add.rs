//! `zblk add`, the hidden `zblk keeper` it starts (unless
//! `--no-recovery`), the hidden `zblk daemon` the keeper (or `add`)
//! starts, and `zblk recover --memfd`, the daemon the keeper starts after
//! a crash.

use super::args::{AddArgs, DaemonArgs, KeeperArgs, RecoverArgs};
use super::fs::{self, FsType};
use super::{
    base::{CliError, CliResult},
    show, sys,
};
use std::fmt::Display;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use zblk_ublk::control::{self, DeviceInfo, Request};
use zblk_ublk::keeper::{self, ready, Adopt, KeeperConfig};
use zblk_ublk::swap::Discard;
use zblk_ublk::{notify, paths, DeviceConfig, Holder, Ready, Start};

/// How long `add` waits for the daemon to bring the device up.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// `zblk add`: checks, starts the daemon (or becomes it), waits for the
/// device, optionally makes it swap, prints it.
pub fn add(a: AddArgs) -> CliResult {
    preflight(&a)?;
    let format = Format::swap_if(&a, Discard::Both);
    if a.foreground {
        return foreground(a, format, Holder::Nobody);
    }
    let info = start(&a, &format)?;
    show::print_device(&info, a.json)
}

/// What a new device becomes once it serves I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Format {
    /// Nothing: a block device as the driver made it.
    Raw,
    /// Swap at this priority, with this discard.
    Swap(i32, Discard),
    /// A new filesystem of this type (mounting it is the caller's, or a
    /// mount unit's).
    Fs(FsType),
}

impl Format {
    /// Swap with `--swap` (its `--priority`), else nothing.
    pub(super) fn swap_if(a: &AddArgs, discard: Discard) -> Format {
        match a.swap {
            true => Format::Swap(a.priority, discard),
            false => Format::Raw,
        }
    }
}

/// The driver is there, we are root, and no daemon serves the device id
/// asked for.
pub(super) fn preflight(a: &AddArgs) -> CliResult {
    sys::check_driver()?;
    sys::check_root("zblk add")?;
    // Read here too, so that a bad file is this command's error, before
    // a daemon starts.
    a.dev.dictionaries().map_err(CliError)?;
    if let Some(id) = a.dev.id {
        if is_live(id) {
            return Err(CliError(format!(
                "device {id} is busy: a zblk daemon already serves it"
            )));
        }
    }
    Ok(())
}

/// Whether a zblk daemon answers for device `id`.
pub(super) fn is_live(id: u32) -> bool {
    control::request(id, &Request::Info, Duration::from_secs(2)).is_ok()
}

/// Starts the daemon in the background, waits for the device and makes
/// it what `format` says (a failure removes the device). What `zblk add`
/// and `zblk setup` both run.
pub(super) fn start(a: &AddArgs, format: &Format) -> Result<DeviceInfo, CliError> {
    let info = spawn_daemon(&a.dev)?;
    let bdev = PathBuf::from(&info.path);
    if !sys::wait_for(Duration::from_secs(10), || bdev.exists()) {
        return Err(CliError(format!(
            "device {} started but {} did not appear",
            info.id(),
            bdev.display()
        )));
    }
    if let Err(e) = prepare(&bdev, format) {
        return Err(remove(info.id(), e));
    }
    Ok(info)
}

/// Deletes device `id`, which failed to become what it was made for;
/// `why` is that failure, worded for the caller.
pub(super) fn remove(id: u32, why: CliError) -> CliError {
    let _ = control::request(
        id,
        &Request::Shutdown { force: true },
        Duration::from_secs(10),
    );
    CliError(format!("{why}; device {id} removed"))
}

/// Makes a new device swap or a filesystem, as `format` says.
fn prepare(bdev: &Path, format: &Format) -> CliResult {
    match format {
        Format::Raw => Ok(()),
        Format::Swap(prio, discard) => make_swap(bdev, *prio, *discard),
        Format::Fs(t) => fs::make_fs(bdev, *t),
    }
}

/// Serves the device in this process until SIGTERM/SIGINT or `zblk del`.
/// With `Holder::Nobody` the device has no recovery.
pub(super) fn foreground(a: AddArgs, format: Format, holder: Holder) -> CliResult {
    let ready = foreground_ready(a.json, format);
    let start = Start::Fresh { holder };
    Ok(zblk_ublk::daemon::run(&a.dev, start, None, ready)?)
}

/// What a foreground daemon does once its device serves I/O: print it,
/// make it swap or a filesystem if asked, then tell systemd (`READY=1`;
/// nothing outside a `Type=notify` unit), so that units ordered after it
/// find swap on, or the filesystem made for their mount.
pub(super) fn foreground_ready(json: bool, format: Format) -> Ready {
    Box::new(move |r: Result<&DeviceInfo, &zblk_ublk::Error>| {
        let Ok(info) = r else { return };
        if let Err(e) = show::print_device(info, json) {
            log::error!("{e}");
        }
        if let Err(e) = prepare(Path::new(&info.path), &format) {
            log::error!("{e}");
        }
        if let Err(e) = notify::ready(&format!("serving {}", info.path)) {
            log::warn!("cannot tell systemd the device is ready: {e}");
        }
    })
}

/// `mkswap` then swapon with `discard` and priority, like zram-generator
/// (by system call: busybox's swapon has neither `--discard` nor `-p`).
fn make_swap(bdev: &Path, priority: i32, discard: Discard) -> CliResult {
    sys::run_tool("mkswap", &[&bdev.to_string_lossy()])?;
    zblk_ublk::swap::swap_on_with(bdev, priority, discard)?;
    warn_small_readahead(std::fs::read_to_string(PAGE_CLUSTER).ok().as_deref());
    Ok(())
}

/// Swap readahead: 2^N pages per swap-in.
const PAGE_CLUSTER: &str = "/proc/sys/vm/page-cluster";

/// Below this `vm.page-cluster` a swap-in request carries at most 4 pages,
/// and every request is a round trip to the daemon, which a zram swap-in
/// does not pay: the fewer pages a request, the more round trips a
/// swap-in workload waits for (BENCHMARKS.md, "Readahead", has the
/// figures). zram guides (and some distributions, for zram) set 0.
const MIN_PAGE_CLUSTER: u32 = 3;

/// Warns, in one line, when `vm.page-cluster` (its text) is below
/// [`MIN_PAGE_CLUSTER`]; returns whether it did.
fn warn_small_readahead(text: Option<&str>) -> bool {
    let Some(n) = text.and_then(|t| t.trim().parse::<u32>().ok()) else {
        return false;
    };
    if n >= MIN_PAGE_CLUSTER {
        return false;
    }
    log::warn!(
        "vm.page-cluster is {n}: swap-ins from a userspace device pay a round trip per {} page(s); \
         set it to {MIN_PAGE_CLUSTER} or more (sysctl vm.page-cluster={MIN_PAGE_CLUSTER}) for zblk swap",
        1u32 << n
    );
    true
}

/// The argument list that makes `zblk daemon` build the same device: the
/// whole configuration as one JSON argument. With recovery on, `zblk
/// keeper`, which starts that daemon and outlives it.
fn daemon_argv(d: &DeviceConfig) -> Vec<String> {
    let cmd = if d.no_recovery { "daemon" } else { "keeper" };
    vec![cmd.to_string(), "--config-json".to_string(), d.to_json()]
}

/// Starts `zblk keeper` (or `zblk daemon`) in its own session, logging to
/// /run/zblk, and waits for its readiness line.
fn spawn_daemon(d: &DeviceConfig) -> Result<DeviceInfo, CliError> {
    use std::os::unix::process::CommandExt;
    paths::ensure_run_dir()
        .map_err(|e| CliError(format!("cannot create {}: {e}", paths::RUN_DIR)))?;
    let log_path = match d.id {
        Some(id) => paths::log_path(id),
        None => PathBuf::from(format!("{}/add-{}.log", paths::RUN_DIR, std::process::id())),
    };
    let log = std::fs::File::create(&log_path)
        .map_err(|e| CliError(format!("cannot create {}: {e}", log_path.display())))?;
    let exe =
        std::env::current_exe().map_err(|e| CliError(format!("cannot find my own binary: {e}")))?;
    let mut cmd = Command::new(exe);
    cmd.args(daemon_argv(d));
    if d.id.is_none() {
        cmd.arg("--log-file").arg(&log_path);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from the
    // terminal so that the shell's signals do not reach it.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| CliError(format!("cannot start the daemon: {e}")))?;
    let Some(out) = child.stdout.take() else {
        return Err(CliError("cannot read the daemon's output".into()));
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = match rx.recv_timeout(READY_TIMEOUT) {
        Ok(l) => l,
        Err(_) => {
            let _ = child.kill();
            return Err(CliError(format!(
                "the daemon did not bring the device up within {READY_TIMEOUT:?}; see {}",
                log_path.display()
            )));
        }
    };
    if line.trim().is_empty() {
        let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
        return Err(CliError(format!(
            "the daemon exited ({status}) before the device was ready; see {}",
            log_path.display()
        )));
    }
    parse_ready(&line)
}

/// Reads the daemon's readiness line.
fn parse_ready(line: &str) -> Result<DeviceInfo, CliError> {
    ready::parse(line).map_err(CliError)
}

/// The readiness line for a start result.
fn ready_line<E: Display + ?Sized>(r: Result<&DeviceInfo, &E>) -> String {
    ready::line(r)
}

/// Says on stdout (one JSON line) that the device is ready or why it could
/// not start, then lets go of stdout.
fn say_ready(r: Result<&DeviceInfo, &zblk_ublk::Error>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", ready_line(r));
    let _ = out.flush();
    drop(out);
    release_stdout();
}

/// `zblk daemon`: serves a new device (handing its memfd to the keeper on
/// `--keeper-fd`).
pub fn daemon(a: DaemonArgs) -> CliResult {
    let keeper = a
        .keeper_fd
        .map(inherited)
        .transpose()?
        .map(std::os::unix::net::UnixStream::from);
    let holder = keeper.map_or(Holder::Nobody, Holder::Keeper);
    let start = Start::Fresh { holder };
    // The error reaches the log through main's one-line report on stderr.
    Ok(zblk_ublk::daemon::run(
        &a.config_json,
        start,
        a.log_file.as_deref(),
        Box::new(say_ready),
    )?)
}

/// `zblk recover -n ID --memfd FD --config-json ..`: the daemon that
/// takes over device ID with the store in the inherited FD.
pub fn recover_daemon(a: RecoverArgs) -> CliResult {
    let (Some(fd), Some(cfg)) = (a.memfd, a.config_json) else {
        return Err(CliError("recover --memfd needs --config-json".into()));
    };
    if cfg.id != Some(a.id) {
        return Err(CliError(format!(
            "recover -n {}: the configuration is of device {:?}",
            a.id, cfg.id
        )));
    }
    let start = Start::Recover {
        memfd: inherited(fd)?,
    };
    Ok(zblk_ublk::daemon::run(
        &cfg,
        start,
        None,
        Box::new(say_ready),
    )?)
}

/// `zblk keeper`: starts the daemon, holds the store, restarts the daemon.
pub fn keeper(a: KeeperArgs) -> CliResult {
    let exe =
        std::env::current_exe().map_err(|e| CliError(format!("cannot find my own binary: {e}")))?;
    let adopt = match (a.adopt, a.link_fd) {
        (Some(pid), Some(fd)) => Some(Adopt {
            pid,
            link: std::os::unix::net::UnixStream::from(inherited(fd)?),
        }),
        _ => None,
    };
    let k = KeeperConfig {
        exe,
        cfg: a.config_json,
        log_file: a.log_file,
        adopt,
    };
    Ok(keeper::run(k, say_ready)?)
}

/// Takes ownership of inherited descriptor `fd` (made close-on-exec).
fn inherited(fd: i32) -> Result<OwnedFd, CliError> {
    // SAFETY: fcntl on any integer is harmless; it fails on a closed one.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(CliError(format!("descriptor {fd} is not an inherited one")));
    }
    // SAFETY: fd is open (fcntl succeeded), was inherited for us alone,
    // and nothing else in this process owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Points stdout at /dev/null, so that `add` (reading the other end) sees
/// the end of the readiness line and returns.
fn release_stdout() {
    // SAFETY: open/dup2/close on descriptors we own; failures leave
    // stdout as it was.
    unsafe {
        let fd = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::dup2(fd, 1);
            libc::close(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::args::{Cli, Cmd};
    use super::*;
    use clap::Parser;

    #[test]
    fn small_readahead_is_warned_about() {
        assert!(warn_small_readahead(Some("0\n")));
        assert!(warn_small_readahead(Some("2")));
        assert!(!warn_small_readahead(Some("3\n")));
        assert!(!warn_small_readahead(Some("5")));
        assert!(!warn_small_readahead(Some("junk")));
        assert!(!warn_small_readahead(None));
    }

    #[test]
    fn daemon_argv_rebuilds_the_same_device() {
        let Cmd::Add(a) = Cli::try_parse_from([
            "zblk",
            "add",
            "-s",
            "2G",
            "-a",
            "zstd:5",
            "-g",
            "4",
            "--mem-limit",
            "1G",
            "-q",
            "3",
            "-d",
            "32",
            "-m",
            "packed",
            "-n",
            "9",
            "--io-buf",
            "256K",
        ])
        .unwrap()
        .cmd
        else {
            panic!()
        };
        let argv = daemon_argv(&a.dev);
        assert_eq!(argv[0], "keeper");
        let Cmd::Keeper(d) = Cli::try_parse_from(std::iter::once("zblk".to_string()).chain(argv))
            .unwrap()
            .cmd
        else {
            panic!()
        };
        let (x, y) = (&a.dev, &d.config_json);
        assert_eq!(format!("{x:?}"), format!("{y:?}"));
        assert_eq!(
            (y.id, y.queues, y.depth, y.io_buf),
            (Some(9), Some(3), 32, Some(256 << 10))
        );
    }

    /// The hook the daemon fires when the device is live, fired here by
    /// hand (no device): READY=1 reaches systemd's socket. The only test
    /// of this crate that sets NOTIFY_SOCKET.
    #[test]
    fn the_foreground_ready_hook_tells_systemd() {
        use std::os::unix::net::UnixDatagram;
        let Cmd::Add(a) = Cli::try_parse_from(["zblk", "add", "-s", "1G"])
            .unwrap()
            .cmd
        else {
            panic!()
        };
        let info = DeviceInfo::new(5, "/dev/ublkb5".into(), &a.dev, 1 << 21);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        std::env::set_var("NOTIFY_SOCKET", &path);
        foreground_ready(true, Format::Raw)(Ok(&info));
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 256];
        let n = sock.recv(&mut buf).unwrap();
        let msg = std::str::from_utf8(&buf[..n]).unwrap();
        assert_eq!(msg, "READY=1\nSTATUS=serving /dev/ublkb5\n");
        // A device that failed to start is not ready: nothing is sent.
        std::env::set_var("NOTIFY_SOCKET", &path);
        foreground_ready(true, Format::Raw)(Err(&zblk_ublk::Error::Refused("no".into())));
        std::env::remove_var("NOTIFY_SOCKET");
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        assert!(sock.recv(&mut buf).is_err(), "READY=1 for a failed start");
    }

    #[test]
    fn readiness_lines_round_trip() {
        let Cmd::Add(a) =
            Cli::try_parse_from(["zblk", "add", "-s", "1G", "-m", "packed", "-q", "2"])
                .unwrap()
                .cmd
        else {
            panic!()
        };
        let mut info = DeviceInfo::new(3, "/dev/ublkb3".into(), &a.dev, 1 << 21);
        info.pid = 42;
        assert_eq!(parse_ready(&ready_line::<str>(Ok(&info))).unwrap(), info);
        let e = parse_ready(&ready_line(Err("cannot create the ublk device: EEXIST"))).unwrap_err();
        assert_eq!(e.0, "cannot create the ublk device: EEXIST");
        assert!(parse_ready("garbage").is_err());
    }
}
