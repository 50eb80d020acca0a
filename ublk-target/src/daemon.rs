//! The daemon's lifecycle: harden the process, add the device, start its
//! queue threads ([`crate::queue`]), serve the control socket
//! ([`crate::control::server`]) and the stop signals ([`crate::signals`])
//! until told to stop, then stop and delete the device ([`crate::device`]).
//!
//! The main thread runs the control loop: the control socket, SIGTERM and
//! SIGINT, and a one-second tick that makes idle queues free their batched
//! handles.

use crate::config::DeviceConfig;
use crate::control::server::{may_stop, ControlSocket};
use crate::control::DeviceInfo;
use crate::error::{Error, Result, Step};
use crate::queue::Queues;
use crate::signals::StopSignals;
use crate::{device, paths, safety};
use libublk::ctrl::UblkCtrl;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Called exactly once: with the device when `/dev/ublkbN` serves I/O, or
/// with the reason it could not start.
pub type Ready = Box<dyn FnOnce(std::result::Result<&DeviceInfo, &Error>) + Send>;

/// How often the control loop ticks idle queues.
const TICK: Duration = Duration::from_secs(1);

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

/// Creates the device of `cfg` and serves it until it is shut down
/// (control socket `shutdown`, SIGTERM/SIGINT when not active swap, or the
/// device being deleted underneath). `ready` hears first. `log_file`, if
/// given, is renamed to `/run/zblk/<id>.log` once the id is known.
pub fn run(cfg: &DeviceConfig, log_file: Option<&Path>, ready: Ready) -> Result<()> {
    let ready = ReadyOnce(Arc::new(Mutex::new(Some(ready))));
    let r = serve(cfg, log_file, &ready);
    if let Err(e) = &r {
        ready.fire(Err(e));
    }
    r
}

fn serve(cfg: &DeviceConfig, log_file: Option<&Path>, ready: &ReadyOnce) -> Result<()> {
    // Before any thread exists, so that all of them inherit it.
    safety::harden()?;
    let signals = StopSignals::block()?;
    let queues = Arc::new(Queues::new(cfg)?);
    let ctrl = device::create(cfg)?;
    let id = ctrl.dev_info().dev_id;
    if let Some(tmp) = log_file {
        move_log(tmp, id);
    }
    let socket = Arc::new(ControlSocket::bind(id)?);
    // The driver may round the buffer size; requests follow its value.
    let info = DeviceInfo::new(
        id,
        ctrl.get_bdev_path(),
        cfg,
        ctrl.dev_info().max_io_buf_bytes,
    );
    log_start(&info);
    let r = start(&ctrl, queues, info, socket.clone(), signals, ready.clone());
    // Deleting the device (dropping the control) before removing the
    // socket: once the socket is gone, `zblk del` knows the device is too.
    drop(ctrl);
    drop(socket);
    match r {
        Ok(_) => {
            log::info!("device {id}: deleted");
            Ok(())
        }
        Err(source) => Err(Error::Ublk {
            step: Step::StartDevice(id),
            source,
        }),
    }
}

/// Starts the queue threads and the disk, then runs the control loop on
/// this thread; returns when the device has stopped.
fn start(
    ctrl: &UblkCtrl,
    queues: Arc<Queues>,
    info: DeviceInfo,
    socket: Arc<ControlSocket>,
    signals: StopSignals,
    ready: ReadyOnce,
) -> std::result::Result<i32, libublk::UblkError> {
    let size = info.config.size;
    let qs = queues.clone();
    let q_fn = move |qid: u16, dev: &_| qs.serve(qid, dev);
    let dev_fn = move |ctrl: &UblkCtrl| {
        ready.fire(Ok(&info));
        control_loop(&queues, &info, &socket, &signals);
        log::info!("device {}: stopping", info.id());
        device::stop(ctrl, info.id());
        queues.wait_exit();
    };
    ctrl.run_target(|dev| device::init_target(dev, size), q_fn, dev_fn)
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

fn log_start(info: &DeviceInfo) {
    let c = &info.config;
    log::info!(
        "device {}: {} bytes, {} queues x {} tags, {} KiB I/O buffers, {}",
        info.id(),
        c.size,
        c.queue_count(),
        c.depth,
        c.io_buf_bytes() >> 10,
        c.engine.algo
    );
}

/// Serves the control socket and signals until the device should stop.
fn control_loop(queues: &Queues, info: &DeviceInfo, socket: &ControlSocket, sig: &StopSignals) {
    let bdev = PathBuf::from(&info.path);
    let mut last_tick = Instant::now();
    loop {
        if queues.alive() == 0 {
            log::warn!("device {}: all queues ended", info.id());
            return;
        }
        let (client, signal) = wait(socket, sig);
        if last_tick.elapsed() >= TICK {
            queues.kick_all();
            last_tick = Instant::now();
        }
        if signal && stop_on_signal(sig, &bdev, info.id()) {
            return;
        }
        if client && socket.serve_one(queues, info) {
            return;
        }
    }
}

/// Waits up to one tick for a client or a signal; says which are ready.
fn wait(socket: &ControlSocket, sig: &StopSignals) -> (bool, bool) {
    let pollfd = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut fds = [pollfd(socket.fd()), pollfd(sig.fd())];
    let timeout = i32::try_from(TICK.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: fds is a valid, writable array of two pollfd.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
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
