//! The keeper's life: start the first daemon, take its memfd, then wait on
//! the daemon and the keeper socket, restarting the daemon as
//! [`super`] describes.

use super::pin::Pinned;
use super::policy::CrashWindow;
use super::spawn::{self, poll_in, Daemon};
use super::{link, KeeperRequest, KeeperStatus, EXIT_HANDOVER};
use crate::config::DeviceConfig;
use crate::control::{self, write_response, DeviceInfo, Request, Response};
use crate::error::{Error, Result, Step};
use crate::{device, fdpass, paths, privileges, safety};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

/// How long a starting daemon may take to bring its device up.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a daemon told to hand over may take to exit.
const HANDOVER_WAIT: Duration = Duration::from_secs(30);

/// What the keeper is started with.
pub struct KeeperConfig {
    /// The zblk binary to start daemons from (read again at every start,
    /// so that an upgraded binary at the same path takes over).
    pub exe: PathBuf,
    /// The device.
    pub cfg: DeviceConfig,
    /// Log file for the first daemon to rename (see `zblk daemon`).
    pub log_file: Option<PathBuf>,
    /// A running daemon to keep instead of starting one: the daemon whose
    /// keeper died started this keeper ([`super::replace`]).
    pub adopt: Option<Adopt>,
}

/// The daemon a replacement keeper takes on.
pub struct Adopt {
    /// Its process id (this keeper's parent).
    pub pid: u32,
    /// The link it started us with; the memfd comes on it.
    pub link: UnixStream,
}

/// The running keeper of one device.
struct Keeper {
    exe: PathBuf,
    /// The device as its first daemon resolved it (id, queues, buffers).
    cfg: DeviceConfig,
    memfd: OwnedFd,
    daemon: Option<Daemon>,
    /// The store, locked while no daemon serves it ([`Pinned`]).
    pinned: Option<Pinned>,
    listener: UnixListener,
    crashes: CrashWindow,
    recoveries: u64,
    restarts: u64,
}

/// Why the daemon ended.
enum Ending {
    /// It deleted the device.
    Deleted,
    /// It handed the device over.
    Handover,
    /// Anything else, in words.
    Crash(String),
}

/// Runs the keeper: `ready` hears when the first daemon's device serves
/// I/O (or why it did not start). Returns when the device is deleted, or
/// after giving up.
pub fn run(
    k: KeeperConfig,
    ready: impl FnOnce(std::result::Result<&DeviceInfo, &Error>),
) -> Result<()> {
    if let Some(a) = k.adopt {
        return adopted(k.exe, k.cfg, a);
    }
    let first = match first_daemon(&k) {
        Ok(f) => f,
        Err(e) => {
            ready(Err(&e));
            return Err(e);
        }
    };
    let (daemon, info, memfd) = first;
    let Some(memfd) = memfd else {
        ready(Ok(&info));
        log::info!(
            "device {}: recovery {}: no keeper needed, leaving",
            info.id(),
            info.recovery
        );
        return Ok(());
    };
    let id = info.id();
    let listener = bind(id)?;
    ready(Ok(&info));
    log::info!(
        "keeper of device {id}: holding its store, daemon pid {}",
        info.pid
    );
    Keeper::new(k.exe, info.config.clone(), memfd, daemon, listener).serve_until_done()
}

/// Keeps the running daemon `a` (whose keeper died): takes its memfd,
/// binds the keeper socket, tells it we are ready, then serves as any
/// keeper.
fn adopted(exe: PathBuf, cfg: DeviceConfig, a: Adopt) -> Result<()> {
    harden(&cfg)?;
    let id = cfg.id.unwrap_or_default();
    a.link
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(Error::os(Step::ReceiveMemfd))?;
    let memfd = fdpass::recv_fd(&a.link).map_err(Error::os(Step::ReceiveMemfd))?;
    let listener = bind(id)?;
    let daemon = Daemon::adopt(a.pid, a.link)?;
    if let Some(l) = &daemon.link {
        link::say(l, link::READY);
    }
    log::info!(
        "keeper of device {id}: replaces a keeper that died, holding the store of daemon pid {}",
        a.pid
    );
    Keeper::new(exe, cfg, memfd, daemon, listener).serve_until_done()
}

/// What every keeper does before it starts anything: out of the OOM
/// killer's reach, locked in memory, with only the capabilities its
/// daemons need ([`crate::privileges`]).
fn harden(cfg: &DeviceConfig) -> Result<()> {
    safety::protect_from_oom()?;
    safety::lock_memory()?;
    // Before any daemon: it starts with the keeper's bounding set.
    let kept = privileges::drop_to(privileges::Needs {
        starts_zblk: true,
        iaa: cfg.engine.algo == zblk::Algo::DeflateIaa,
    })?;
    // Only now: the log writer thread takes the capabilities left.
    crate::logsink::start_writer();
    log::info!("keeper: capabilities kept: {}", privileges::names(&kept));
    Ok(())
}

/// Hardens the keeper, starts the first daemon and takes its memfd (none
/// when the device has no recovery).
fn first_daemon(k: &KeeperConfig) -> Result<(Daemon, DeviceInfo, Option<OwnedFd>)> {
    harden(&k.cfg)?;
    let (ours, theirs) = UnixStream::pair().map_err(Error::os(Step::SendMemfd))?;
    let args = spawn::fresh_args(&k.cfg, theirs.as_raw_fd(), k.log_file.as_deref());
    let (mut daemon, out) = spawn::spawn(&k.exe, &args, theirs.as_raw_fd())?;
    drop(theirs);
    let info = match spawn::read_ready(out, READY_TIMEOUT) {
        Ok(i) => i,
        Err(e) => {
            daemon.kill();
            return Err(e);
        }
    };
    if !info.recovery.is_on() {
        return Ok((daemon, info, None));
    }
    // Sent before the device was created, so it is waiting already.
    ours.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(Error::os(Step::ReceiveMemfd))?;
    let memfd = fdpass::recv_fd(&ours).map_err(Error::os(Step::ReceiveMemfd))?;
    Ok((daemon, info, Some(memfd)))
}

/// Binds the keeper socket of device `id` (0600 in the 0700 run dir).
fn bind(id: u32) -> Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let path = paths::keeper_socket_path(id);
    let _ = std::fs::remove_file(&path);
    let l = UnixListener::bind(&path).map_err(Error::os(Step::Bind(path.clone())))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(Error::os(Step::Chmod(path.clone())))?;
    Ok(l)
}

impl Keeper {
    fn new(
        exe: PathBuf,
        cfg: DeviceConfig,
        memfd: OwnedFd,
        daemon: Daemon,
        listener: UnixListener,
    ) -> Keeper {
        Keeper {
            exe,
            cfg,
            memfd,
            daemon: Some(daemon),
            pinned: None,
            listener,
            crashes: CrashWindow::default(),
            recoveries: 0,
            restarts: 0,
        }
    }

    /// [`Keeper::serve`], then removes the keeper socket.
    fn serve_until_done(mut self) -> Result<()> {
        let r = self.serve();
        let _ = std::fs::remove_file(paths::keeper_socket_path(self.id()));
        r
    }

    fn id(&self) -> u32 {
        self.cfg.id.unwrap_or_default()
    }

    /// Waits on the daemon and the socket until the device is deleted or
    /// the keeper gives up.
    fn serve(&mut self) -> Result<()> {
        loop {
            let (died, client) = self.wait();
            if died {
                let died_at = Instant::now();
                if let Some(done) = self.on_exit(died_at)? {
                    return done;
                }
            }
            if client {
                if let Ok((s, _)) = self.listener.accept() {
                    self.answer(s);
                }
            }
        }
    }

    /// Polls the daemon's pidfd and the listener (forever).
    fn wait(&self) -> (bool, bool) {
        let pollfd = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let dfd = self.daemon.as_ref().map_or(-1, |d| d.pidfd.as_raw_fd());
        let mut fds = [pollfd(dfd), pollfd(self.listener.as_raw_fd())];
        // SAFETY: fds is a valid, writable array of two pollfd (a negative
        // fd is ignored by poll).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            return (false, false);
        }
        let up = |p: &libc::pollfd| p.revents & (libc::POLLIN | libc::POLLHUP) != 0;
        (up(&fds[0]), up(&fds[1]))
    }

    /// The daemon exited: reaps it and acts. `Some` ends the keeper.
    fn on_exit(&mut self, died_at: Instant) -> Result<Option<Result<()>>> {
        let Some(mut d) = self.daemon.take() else {
            return Ok(None);
        };
        let pid = d.pid;
        let end = match (&mut d.child, &d.link) {
            (Some(c), _) => ending(c.wait().map_err(Error::os(Step::WatchDaemon))?),
            (None, Some(l)) => last_word_ending(link::last_word(l)),
            (None, None) => Ending::Crash("ended".into()),
        };
        match end {
            Ending::Deleted => {
                log::info!("keeper of device {}: device deleted, leaving", self.id());
                Ok(Some(Ok(())))
            }
            Ending::Handover => {
                self.restarts += 1;
                self.respawn(died_at, &format!("daemon pid {pid} handed over"));
                Ok(None)
            }
            Ending::Crash(how) => {
                if self.crashes.crash(died_at) {
                    return Ok(Some(self.give_up(&how)));
                }
                self.recoveries += 1;
                self.respawn(died_at, &format!("daemon pid {pid} {how}"));
                Ok(None)
            }
        }
    }

    /// Starts a recovering daemon; a failure shows as its exit, which the
    /// next round counts as a crash.
    fn respawn(&mut self, since: Instant, why: &str) {
        let args = spawn::recover_args(&self.cfg, self.memfd.as_raw_fd());
        let spawned = spawn::spawn(&self.exe, &args, self.memfd.as_raw_fd());
        // Pinned while the new daemon starts (not before: it would delay
        // the start), until it serves, having mapped and locked the store
        // itself; kept while no daemon could be started.
        if self.pinned.is_none() {
            self.pinned = Some(Pinned::new(self.memfd.as_fd()));
        }
        let pinned = self.pinned.as_ref().map_or(0, |p| p.bytes() >> 20);
        let (mut d, out) = match spawned {
            Ok(x) => x,
            Err(e) => {
                log::error!(
                    "device {}: {why}; {e}; its I/O waits for `zblk recover -n {}`",
                    self.id(),
                    self.id()
                );
                return;
            }
        };
        match spawn::read_ready(out, READY_TIMEOUT) {
            Ok(info) => {
                log::info!(
                    "device {}: {why}; daemon pid {} took over in {} ms ({pinned} MB pinned meanwhile)",
                    self.id(),
                    info.pid,
                    since.elapsed().as_millis(),
                );
                self.pinned = None;
            }
            Err(e) => {
                log::error!("device {}: {why}; the new daemon failed: {e}", self.id());
                d.kill();
            }
        }
        self.daemon = Some(d);
    }

    /// Too many crashes: deletes the device (the driver fails the I/O it
    /// holds) and says so in one line.
    fn give_up(&mut self, how: &str) -> Result<()> {
        let id = self.id();
        log::error!(
            "device {id}: giving up: its daemon crashed {} times within {:?} (last: {how}); \
             deleting the device, its I/O fails",
            super::policy::GIVE_UP_CRASHES,
            super::policy::GIVE_UP_WINDOW
        );
        device::give_up(id)?;
        let _ = std::fs::remove_file(paths::socket_path(id));
        Err(Error::Refused(format!(
            "device {id}: gave up after repeated crashes"
        )))
    }

    /// Answers one client of the keeper socket.
    fn answer(&mut self, mut s: UnixStream) {
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
        if control::refuse_non_root(&mut s) {
            return;
        }
        let resp = match read_request_as::<KeeperRequest>(&mut s) {
            Ok(KeeperRequest::Status) => json(serde_json::to_value(self.status())),
            Ok(KeeperRequest::Restart) => self.restart(),
            Ok(KeeperRequest::Recover) => self.recover_now(),
            Err(e) => Response::err(e),
        };
        let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
        if let Err(e) = write_response(&mut s, &resp) {
            log::warn!("keeper client: {e}");
        }
    }

    fn status(&mut self) -> KeeperStatus {
        let pid = self.daemon.as_ref().map_or(0, |d| d.pid);
        let running = self
            .daemon
            .as_ref()
            .is_some_and(|d| !poll_in(d.pidfd.as_raw_fd(), Duration::ZERO));
        let answers =
            running && control::request(self.id(), &Request::Info, Duration::from_secs(1)).is_ok();
        // A daemon that runs but does not answer yet is starting; with no
        // daemon at all, the driver says what became of the device.
        let state = match (running, answers) {
            (true, true) => "live",
            (true, false) => "recovering",
            (false, _) => device::driver_state(self.id()),
        };
        KeeperStatus {
            state: state.to_string(),
            keeper_pid: std::process::id(),
            daemon_pid: pid,
            recoveries: self.recoveries,
            restarts: self.restarts,
            recent_crashes: self.crashes.recent(Instant::now()),
        }
    }

    /// `zblk restart`: tells the daemon to hand over, waits for it to go,
    /// starts the new one.
    fn restart(&mut self) -> Response {
        let id = self.id();
        if let Err(e) = control::request(id, &Request::Handover, Duration::from_secs(10)) {
            return Response::err(format!("device {id}: the daemon refused to hand over: {e}"));
        }
        let t0 = Instant::now();
        let gone = self
            .daemon
            .as_ref()
            .is_some_and(|d| poll_in(d.pidfd.as_raw_fd(), HANDOVER_WAIT));
        if !gone {
            return Response::err(format!(
                "device {id}: the daemon did not exit within {HANDOVER_WAIT:?}"
            ));
        }
        match self.on_exit(t0) {
            Ok(None) => {}
            Ok(Some(_)) | Err(_) => {
                return Response::err(format!("device {id}: the daemon did not hand over"))
            }
        }
        let pid = self.daemon.as_ref().map_or(0, |d| d.pid);
        Response::ok(serde_json::json!({ "pid": pid, "ms": t0.elapsed().as_millis() as u64 }))
    }

    /// `zblk recover` by hand: starts a daemon unless one runs.
    fn recover_now(&mut self) -> Response {
        if let Some(d) = &self.daemon {
            if !poll_in(d.pidfd.as_raw_fd(), Duration::ZERO) {
                return Response::err(format!(
                    "device {} is live: its daemon (pid {}) serves it",
                    self.id(),
                    d.pid
                ));
            }
            // It just died: the loop's own round recovers it.
            return Response::ok(serde_json::json!({ "pid": 0 }));
        }
        self.respawn(Instant::now(), "recovery asked for");
        let pid = self.daemon.as_ref().map_or(0, |d| d.pid);
        Response::ok(serde_json::json!({ "pid": pid }))
    }
}

/// Why a daemon with this exit status ended.
fn ending(status: ExitStatus) -> Ending {
    match (status.code(), status.signal()) {
        (Some(0), _) => Ending::Deleted,
        (Some(EXIT_HANDOVER), _) => Ending::Handover,
        (Some(c), _) => Ending::Crash(format!("exited with status {c}")),
        (None, Some(sig)) => Ending::Crash(format!("was killed by signal {sig}")),
        (None, None) => Ending::Crash("ended".into()),
    }
}

/// Why a daemon that is not our child ended: what it said last
/// ([`link`]); nothing is a crash.
fn last_word_ending(word: Option<u8>) -> Ending {
    match word {
        Some(link::DELETED) => Ending::Deleted,
        Some(link::HANDOVER) => Ending::Handover,
        _ => Ending::Crash("died with nothing said (it is not this keeper's child)".into()),
    }
}

/// Reads one request line of type `R`.
fn read_request_as<R: serde::de::DeserializeOwned>(
    s: &mut UnixStream,
) -> std::result::Result<R, String> {
    use std::io::{BufRead, BufReader, Read};
    let mut line = String::new();
    BufReader::new((&*s).take(control::MAX_LINE))
        .read_line(&mut line)
        .map_err(|e| format!("reading request: {e}"))?;
    serde_json::from_str(&line).map_err(|e| format!("bad request: {e}"))
}

fn json(v: serde_json::Result<serde_json::Value>) -> Response {
    match v {
        Ok(v) => Response::ok(v),
        Err(e) => Response::err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_are_told_apart() {
        let st = |raw| ExitStatus::from_raw(raw);
        assert!(matches!(ending(st(0)), Ending::Deleted));
        assert!(matches!(ending(st(EXIT_HANDOVER << 8)), Ending::Handover));
        let Ending::Crash(how) = ending(st(9)) else {
            panic!()
        };
        assert_eq!(how, "was killed by signal 9");
        let Ending::Crash(how) = ending(st(1 << 8)) else {
            panic!()
        };
        assert_eq!(how, "exited with status 1");
        assert!(matches!(
            last_word_ending(Some(link::DELETED)),
            Ending::Deleted
        ));
        assert!(matches!(
            last_word_ending(Some(link::HANDOVER)),
            Ending::Handover
        ));
        assert!(matches!(last_word_ending(None), Ending::Crash(_)));
        assert!(matches!(last_word_ending(Some(b'x')), Ending::Crash(_)));
    }
}
