//! The daemon's lifecycle: harden the process, make or recover the store,
//! add the device or take it over, start its queue threads
//! ([`crate::queue`]), serve the control socket ([`crate::control::server`])
//! and the stop signals ([`crate::signals`]) until told to stop, then stop
//! and delete the device ([`crate::device`]), or leave it to the next
//! daemon (a handover).
//!
//! The main thread runs the control loop: the control socket, SIGTERM and
//! SIGINT, and a one-second tick that makes idle queues free their batched
//! handles.

use crate::config::DeviceConfig;
use crate::control::server::{may_stop, ControlSocket, Next};
use crate::control::DeviceInfo;
use crate::error::{Error, Result, Step};
use crate::features::{Features, Recovery};
use crate::policy::{self, Policy, Settings};
use crate::queue::Queues;
use crate::signals::StopSignals;
use crate::transport::Transport;
use crate::{device, fdpass, io_threads, keeper, notify, paths, placement, privileges, safety};
use libublk::ctrl::UblkCtrl;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zblk::{Store, StoreConfig};

/// Called exactly once: with the device when `/dev/ublkbN` serves I/O, or
/// with the reason it could not start.
pub type Ready = Box<dyn FnOnce(std::result::Result<&DeviceInfo, &Error>) + Send>;

/// How often the control loop ticks idle queues.
const TICK: Duration = Duration::from_secs(1);

/// How long a handover waits for the driver to quiesce the device.
const QUIESCE_TIMEOUT_MS: u64 = 10_000;

/// Who keeps a new store's memfd while no daemon runs, so that the next
/// daemon can recover the device from it.
pub enum Holder {
    /// Nobody: the device is made without recovery (`--no-recovery`, or a
    /// foreground daemon outside a service manager).
    Nobody,
    /// The keeper that started us; the memfd goes over this socket.
    Keeper(UnixStream),
    /// systemd's file-descriptor store of the unit we are the main process
    /// of ([`crate::notify::store_fd`]).
    Systemd,
}

/// Where the daemon's store and device come from.
pub enum Start {
    /// A new store and a new device. With recovery on, the store's memfd
    /// goes to `holder`.
    Fresh {
        /// Who keeps the store's memfd.
        holder: Holder,
    },
    /// Device `cfg.id`, whose daemon died, with its store in `memfd`.
    Recover {
        /// The dead daemon's store.
        memfd: OwnedFd,
    },
}

/// Calls [`Ready`] at most once, from whichever path gets there first.
#[derive(Clone)]
struct ReadyOnce(Arc<Mutex<Option<Ready>>>);

impl ReadyOnce {
    fn fire(&self, r: std::result::Result<&DeviceInfo, &Error>) {
        let f = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(f) = f {
            f(r);
        }
    }
}

/// Creates (or takes over) the device of `cfg` and serves it until it is
/// shut down (control socket `shutdown`, SIGTERM/SIGINT when not active
/// swap, or the device being deleted underneath). `ready` hears first.
/// `log_file`, if given, is renamed to `/run/zblk/<id>.log` once the id is
/// known. A handover does not return: the process exits with
/// [`keeper::EXIT_HANDOVER`].
pub fn run(cfg: &DeviceConfig, start: Start, log_file: Option<&Path>, ready: Ready) -> Result<()> {
    let ready = ReadyOnce(Arc::new(Mutex::new(Some(ready))));
    let r = serve(cfg, start, log_file, &ready);
    if let Err(e) = &r {
        ready.fire(Err(e));
    }
    r
}

/// The device's control, engine and recovery, made or taken over.
struct Device {
    ctrl: UblkCtrl,
    /// The configuration it runs with: `cfg`, but for a recovered device
    /// without `UBLK_F_PER_IO_DAEMON`, which keeps one I/O thread a queue
    /// (`device::recover`).
    config: DeviceConfig,
    queues: Arc<Queues>,
    recovery: Recovery,
    recovered: bool,
}

fn serve(
    cfg: &DeviceConfig,
    start: Start,
    log_file: Option<&Path>,
    ready: &ReadyOnce,
) -> Result<()> {
    let t0 = Instant::now();
    // Before any thread exists, so that all of them inherit it (the log
    // writer starts after the privileges are dropped).
    safety::harden()?;
    // A recovering daemon's parent is its keeper, or systemd for a
    // zblk@N.service daemon recovered from the fd store (no keeper then).
    let has_keeper = match &start {
        Start::Fresh { holder } => matches!(holder, Holder::Keeper(_)),
        Start::Recover { .. } => keeper::replace::parent_is_keeper(),
    };
    drop_privileges(cfg, has_keeper)?;
    // Watched from here: a keeper that dies before the device is up is
    // replaced at the control loop's first round.
    let watch = Arc::new(Mutex::new(has_keeper.then(keeper::KeeperWatch::parent)));
    let signals = StopSignals::block()?;
    let features = Features::probe();
    log::info!(
        "ublk driver features {:#x}: {}",
        features.0,
        features.names().join(" ")
    );
    let dev = match start {
        Start::Fresh { holder } => fresh(cfg, features, holder)?,
        Start::Recover { memfd } => recover(cfg, memfd)?,
    };
    let id = dev.ctrl.dev_info().dev_id;
    // Reported, and kept for the next daemon, as the device runs.
    let cfg = &dev.config.clone();
    if let Some(tmp) = log_file {
        move_log(tmp, id);
    }
    let socket = Arc::new(ControlSocket::bind(id)?);
    // The driver may round the buffer size; requests follow its value.
    let info = DeviceInfo::new(
        id,
        dev.ctrl.get_bdev_path(),
        cfg,
        dev.ctrl.dev_info().max_io_buf_bytes,
    )
    .with_recovery(dev.recovery, features)
    .with_transport(Transport::of_flags(dev.ctrl.dev_info().flags));
    log_start(&info, dev.recovered, t0);
    let policy = Arc::new(idle_policy(cfg, &dev));
    let r = start_device(
        &dev,
        info,
        socket.clone(),
        signals,
        ready.clone(),
        watch.clone(),
        policy,
    );
    if dev.recovered && r.is_ok() {
        device::delete_recovered(&dev.ctrl, id);
    }
    // Deleting the device (dropping the control) before removing the
    // socket: once the socket is gone, `zblk del` knows the device is too.
    drop(dev);
    drop(socket);
    match r {
        Ok(_) => {
            log::info!("device {id}: deleted");
            if let Some(w) = lock(&watch).as_ref() {
                w.say(keeper::link::DELETED);
            }
            Ok(())
        }
        Err(source) => Err(Error::Ublk {
            step: Step::StartDevice(id),
            source,
        }),
    }
}

/// Keeps only the capabilities a running daemon uses
/// ([`crate::privileges`]): hardened, it needs no more than the ublk
/// control commands and `mlock`.
/// A daemon with a keeper keeps what a keeper keeps: it starts a new
/// keeper if its own dies ([`keeper::replace`]).
fn drop_privileges(cfg: &DeviceConfig, has_keeper: bool) -> Result<()> {
    let needs = privileges::Needs {
        starts_zblk: has_keeper,
        iaa: cfg.engine.algo == zblk::Algo::DeflateIaa,
    };
    let kept = privileges::drop_to(needs)?;
    // Only now: the writer thread takes the capabilities left (see
    // `crate::logsink`).
    crate::logsink::start_writer();
    log::info!("capabilities kept: {}", privileges::names(&kept));
    Ok(())
}

/// The idle policy of `cfg` on the device's store (for a recovered one,
/// what its last daemon was set to, which the store keeps). A fresh device
/// was checked before it was created ([`fresh`]); a recovered one whose
/// store refuses the settings runs with the policy off rather than not at
/// all (its swap must come back).
fn idle_policy(cfg: &DeviceConfig, dev: &Device) -> Policy {
    let settings = if dev.recovered {
        Settings::recovered(cfg, dev.queues.store())
    } else {
        Settings::of(cfg)
    };
    let store = dev.queues.store();
    let settings = match settings.check(store).and_then(|()| settings.record(store)) {
        Ok(()) => settings,
        Err(e) => {
            log::warn!("idle policy off: {e}");
            Settings::default()
        }
    };
    Policy::new(settings, policy::Timing::default())
}

/// A new store and device, with the recovery the driver offers unless
/// `--no-recovery` or nobody holds the store; the memfd goes to `holder`
/// before the device exists, so that no page is ever stored that only
/// this process could find.
fn fresh(cfg: &DeviceConfig, features: Features, holder: Holder) -> Result<Device> {
    io_threads::check(cfg.io_threads, cfg.depth, cfg.transport, features)
        .map_err(Error::Refused)?;
    let wanted = !cfg.no_recovery && !matches!(holder, Holder::Nobody);
    let recovery = if !wanted {
        Recovery::Off
    } else {
        features.recovery()
    };
    if wanted && recovery != Recovery::Reissue {
        log::warn!(
            "the ublk driver offers recovery '{recovery}' only (USER_RECOVERY_REISSUE missing)"
        );
    }
    let store_cfg = StoreConfig {
        shared: recovery.is_on(),
        dictionaries: cfg.dictionaries().map_err(Error::Refused)?,
        ..cfg.store_config()
    };
    let queues = Arc::new(Queues::with_store(cfg, Store::new(store_cfg)?)?);
    // Before the device exists: settings it cannot run are a bad `add`.
    Settings::of(cfg)
        .check(queues.store())
        .map_err(Error::Refused)?;
    if let Some(fd) = queues.store().memory_fd() {
        match holder {
            Holder::Keeper(k) => fdpass::send_fd(&k, fd).map_err(Error::os(Step::SendMemfd))?,
            Holder::Systemd => notify::store_fd(&fd).map_err(Error::os(Step::SendMemfd))?,
            Holder::Nobody => {}
        }
    }
    let choice = io_threads::transport_choice(cfg.io_threads, cfg.transport);
    let transport = Transport::choose(choice, features).map_err(Error::Refused)?;
    let ctrl = device::create(cfg, recovery, features, transport)?;
    Ok(Device {
        ctrl,
        config: cfg.clone(),
        queues,
        recovery,
        recovered: false,
    })
}

/// The store a dead daemon left in `memfd`, and its device taken over.
fn recover(cfg: &DeviceConfig, memfd: OwnedFd) -> Result<Device> {
    let id = cfg.id.ok_or(Error::Refused(
        "recovery needs the device id (-n)".to_string(),
    ))?;
    let t0 = Instant::now();
    let store = Store::recover(cfg.store_config(), memfd)?;
    log::info!(
        "device {id}: store recovered in {} ms",
        t0.elapsed().as_millis()
    );
    let ctrl = device::recover(cfg, id)?;
    let config = DeviceConfig {
        io_threads: ctrl.io_threads_per_queue(),
        ..cfg.clone()
    };
    let queues = Arc::new(Queues::with_store(&config, store)?);
    queues.log_first_request();
    let reissue = u64::from(libublk::sys::UBLK_F_USER_RECOVERY_REISSUE);
    let recovery = if ctrl.dev_info().flags & reissue != 0 {
        Recovery::Reissue
    } else {
        Recovery::Plain
    };
    Ok(Device {
        ctrl,
        config,
        queues,
        recovery,
        recovered: true,
    })
}

/// Starts the queue threads and the disk (or ends the recovery), then
/// runs the control loop on this thread; returns when the device has
/// stopped.
fn start_device(
    dev: &Device,
    info: DeviceInfo,
    socket: Arc<ControlSocket>,
    signals: StopSignals,
    ready: ReadyOnce,
    watch: Watch,
    policy: Arc<Policy>,
) -> std::result::Result<i32, libublk::UblkError> {
    let size = info.config.size;
    let queues = dev.queues.clone();
    let qs = queues.clone();
    let q_fn = move |qid: u16, d: &_| qs.serve(qid, d);
    let dev_fn = move |ctrl: &UblkCtrl| {
        // libublk pinned the queue threads before starting the device.
        placement::apply(info.config.queue_cpus, &queues.thread_ids());
        if info.config.poll_us > 0 && info.config.queue_cpus != placement::QueueCpus::Other {
            log::warn!(
                "device {}: --poll-us without --queue-cpus other may poll on the CPU whose task waits for the request",
                info.id()
            );
        }
        ready.fire(Ok(&info));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = policy::spawn(queues.clone(), policy.clone(), stop.clone())
            .map_err(|e| log::error!("device {}: no idle policy thread: {e}", info.id()))
            .ok();
        let mut w = lock(&watch);
        let next = control_loop(&queues, &policy, &info, &socket, &signals, &mut w);
        // Before a handover or stop: no round is left half done.
        stop.store(true, Ordering::SeqCst);
        if thread
            .map(std::thread::JoinHandle::join)
            .is_some_and(|r| r.is_err())
        {
            log::error!("device {}: the idle policy thread panicked", info.id());
        }
        if next == Next::Handover {
            hand_over(ctrl, &queues, info.id(), w.as_ref());
        }
        drop(w);
        log::info!("device {}: stopping", info.id());
        device::stop(ctrl, info.id());
        queues.wait_exit();
    };
    dev.ctrl
        .run_target(|d| device::init_target(d, size), q_fn, dev_fn)
}

/// Stops serving without deleting the device and exits with
/// [`keeper::EXIT_HANDOVER`]: with `UBLK_F_QUIESCE` (and the classic
/// transport) the driver first waits for the requests in flight to
/// complete; without it the process just exits and the driver issues them
/// again to the next daemon, as after a crash.
fn hand_over(ctrl: &UblkCtrl, queues: &Queues, id: u32, watch: Option<&keeper::KeeperWatch>) -> ! {
    let flags = ctrl.dev_info().flags;
    // Not for a batch device: see crate::transport.
    let batch = Transport::of_flags(flags) == Transport::Batch;
    if flags & u64::from(libublk::sys::UBLK_F_QUIESCE) != 0 && !batch {
        queues.begin_handover();
        match ctrl.quiesce_dev(QUIESCE_TIMEOUT_MS) {
            // The queue threads do not end (see crate::queue): what matters
            // is that the requests they served are committed.
            Ok(_) if !queues.drain_for_handover() => log::warn!(
                "device {id}: a queue did not go quiet after the quiesce; \
                 the next daemon gets its requests again"
            ),
            Ok(_) => {}
            Err(e) => log::warn!(
                "device {id}: quiesce failed ({}); exiting anyway",
                crate::error::UblkCause(&e)
            ),
        }
        ctrl.disown();
    }
    log::info!("device {id}: handed over, exiting");
    if let Some(w) = watch {
        w.say(keeper::link::HANDOVER);
    }
    std::process::exit(keeper::EXIT_HANDOVER)
}
/// Renames the log the daemon was started with to the device's log.
fn move_log(tmp: &Path, id: u32) {
    if let Err(e) = std::fs::rename(tmp, paths::log_path(id)) {
        log::warn!(
            "cannot rename {} to {}: {e}",
            tmp.display(),
            paths::log_path(id).display()
        );
    }
}

fn log_start(info: &DeviceInfo, recovered: bool, t0: Instant) {
    let c = &info.config;
    log::info!(
        "device {}: {} bytes, {} queues x {} tags, {} I/O threads a queue, \
         {} KiB I/O buffers, {}, recovery {}",
        info.id(),
        c.size,
        c.queue_count(),
        c.depth,
        c.io_threads,
        c.io_buf_bytes() >> 10,
        c.engine.algo,
        info.recovery
    );
    if recovered {
        log::info!(
            "device {}: taken over {} ms after this daemon started",
            info.id(),
            t0.elapsed().as_millis()
        );
    }
}

/// The daemon's watch on its keeper, if it has one: the control loop
/// uses it, the exit paths say goodbye on it.
type Watch = Arc<Mutex<Option<keeper::KeeperWatch>>>;

fn lock(w: &Watch) -> std::sync::MutexGuard<'_, Option<keeper::KeeperWatch>> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves the control socket and signals until the device should stop or
/// be handed over; replaces the keeper when it dies.
fn control_loop(
    queues: &Queues,
    policy: &Policy,
    info: &DeviceInfo,
    socket: &ControlSocket,
    sig: &StopSignals,
    watch: &mut Option<keeper::KeeperWatch>,
) -> Next {
    let bdev = PathBuf::from(&info.path);
    let mut last_tick = Instant::now();
    loop {
        if queues.alive() == 0 {
            log::warn!("device {}: all queues ended", info.id());
            return Next::Stop;
        }
        let keeper_fd = watch.as_ref().map_or(-1, |w| w.fd());
        let (client, signal) = wait(socket, sig, keeper_fd);
        // Without recovery the first keeper leaves on purpose (nothing to
        // keep): no replacement then.
        if let (Some(w), Some(fd), true) = (
            watch.as_mut(),
            queues.store().memory_fd(),
            info.recovery.is_on(),
        ) {
            if w.needs_keeper() {
                w.replace(&info.config, fd);
            }
        }
        if last_tick.elapsed() >= TICK {
            queues.kick_all();
            last_tick = Instant::now();
        }
        if signal && stop_on_signal(sig, &bdev, info.id()) {
            return Next::Stop;
        }
        if client {
            match socket.serve_one(queues, policy, info) {
                Next::Serve => {}
                next => return next,
            }
        }
    }
}

/// Waits up to one tick for a client, a signal or the keeper's exit; says
/// whether a client and a signal are ready.
fn wait(socket: &ControlSocket, sig: &StopSignals, keeper: RawFd) -> (bool, bool) {
    let pollfd = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut fds = [pollfd(socket.fd()), pollfd(sig.fd()), pollfd(keeper)];
    let timeout = i32::try_from(TICK.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: fds is a valid, writable array of three pollfd (a negative
    // fd is ignored by poll).
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 3, timeout) };
    if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
        log::error!("poll: {}", std::io::Error::last_os_error());
        std::thread::sleep(Duration::from_millis(100));
    }
    let ready = |p: &libc::pollfd| p.revents & libc::POLLIN != 0;
    (ready(&fds[0]), ready(&fds[1]))
}

/// Reads the pending signal; true when the device may stop for it.
fn stop_on_signal(sig: &StopSignals, bdev: &Path, id: u32) -> bool {
    let Some(signo) = sig.read() else {
        return false;
    };
    match may_stop(bdev, false) {
        Ok(()) => {
            log::info!("device {id}: signal {signo}, shutting down");
            true
        }
        Err(e) => {
            log::warn!("signal {signo} ignored: {e}");
            false
        }
    }
}
