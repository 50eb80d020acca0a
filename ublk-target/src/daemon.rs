//! The daemon: a ublk device whose queues are served by the engine.
//!
//! One thread per ublk queue (libublk's `run_target`), each owning one
//! [`QueueCtx`] and the queue's I/O buffers; requests are handled inline by
//! [`crate::io::handle_io`] and completed at once. The main thread runs the
//! control loop: the control socket, SIGTERM/SIGINT, and a one-second tick
//! that makes idle queues free their batched handles.
//!
//! Queues hear from the control loop through one eventfd each, read by an
//! io_uring request in the queue's own ring: the queue thread wakes, frees
//! its batch (only it may touch its context) and publishes the tick it has
//! seen. `stats` waits for every queue to do so before merging the shards.

use crate::control::{self, DeviceInfo, Request, Response};
use crate::io::{handle_io, IoDesc, RateLimit};
use crate::{params, paths, safety, swap};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::{UblkDev, UblkIOCtx, UblkQueue};
use libublk::{BufDesc, BufDescList, UblkFlags, UblkIORes};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zblk::Mode;
use zblk::{Algo, QueueCtx, Store, StoreConfig};

/// How a device is created.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// ublk device id, or -1 to let the driver choose.
    pub id: i32,
    /// Device size in bytes (a non-zero multiple of 4 KB).
    pub size: u64,
    /// Compression algorithm.
    pub algo: Algo,
    /// Pages per compression group.
    pub group_pages: usize,
    /// Per-page or packed group objects.
    pub mode: Mode,
    /// Memory limit in bytes (0: none).
    pub mem_limit: u64,
    /// Number of queues (one thread each).
    pub queues: u16,
    /// Queue depth.
    pub depth: u16,
    /// Per-tag I/O buffer bytes; 0 picks [`params::auto_io_buf_bytes`].
    pub io_buf_bytes: u32,
    /// A log file to rename to `/run/zblk/<id>.log` once the id is known.
    pub log_file: Option<PathBuf>,
}

/// Called exactly once: with the device when `/dev/ublkbN` serves I/O, or
/// with the reason it could not start.
pub type Ready = Box<dyn FnOnce(Result<&DeviceInfo, &str>) + Send>;

/// io_uring op tag of a queue's eventfd read (any value ublk commands do
/// not use in the target-I/O space).
const TICK_OP: u32 = 0xfe;

/// How often the control loop ticks idle queues.
const TICK: Duration = Duration::from_secs(1);

/// How long `stats` waits for the queues to flush their batches.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// How long shutdown waits for the queue threads to exit.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// What a queue thread shares with the control loop.
struct QueueShared {
    /// eventfd the control loop writes to wake the queue.
    kick: OwnedFd,
    /// Last tick generation the queue has handled.
    done: AtomicU64,
    /// Handles batched in the queue's context at that moment.
    pending: AtomicU64,
    /// Where the queue's ring reads the eventfd counter to (never read).
    kick_buf: AtomicU64,
}

/// State shared by all threads of one daemon.
struct Shared {
    store: Arc<Store>,
    queues: Vec<QueueShared>,
    /// Engine contexts waiting for their queue thread, by queue id.
    ctxs: Mutex<Vec<Option<QueueCtx>>>,
    /// Generation of the latest tick.
    tick_gen: AtomicU64,
    /// Queue threads still serving.
    alive: AtomicUsize,
}

impl Shared {
    /// Wakes every queue; returns the generation they will report.
    fn kick_all(&self) -> u64 {
        let gen = self.tick_gen.fetch_add(1, Ordering::SeqCst) + 1;
        let one = 1u64.to_ne_bytes();
        for q in &self.queues {
            // SAFETY: writing 8 bytes from a valid buffer to an eventfd we own.
            let r = unsafe { libc::write(q.kick.as_raw_fd(), one.as_ptr().cast(), one.len()) };
            if r < 0 {
                log::warn!("kick eventfd: {}", std::io::Error::last_os_error());
            }
        }
        gen
    }

    /// Kicks every queue and waits until each has freed its batch (or is
    /// gone, or `FLUSH_WAIT` passed). Returns the handles still pending.
    fn flush_all(&self) -> u64 {
        let gen = self.kick_all();
        let t0 = Instant::now();
        while self.alive.load(Ordering::SeqCst) > 0
            && self
                .queues
                .iter()
                .any(|q| q.done.load(Ordering::SeqCst) < gen)
        {
            if t0.elapsed() > FLUSH_WAIT {
                log::warn!("stats: a queue did not answer within {FLUSH_WAIT:?}");
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.queues
            .iter()
            .map(|q| q.pending.load(Ordering::SeqCst))
            .sum()
    }
}

/// Calls [`Ready`] at most once, from whichever path gets there first.
#[derive(Clone)]
struct ReadyOnce(Arc<Mutex<Option<Ready>>>);

impl ReadyOnce {
    fn fire(&self, r: Result<&DeviceInfo, &str>) {
        let f = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(f) = f {
            f(r);
        }
    }
}

/// Removes the control socket when the daemon ends.
struct SocketGuard(PathBuf);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Creates the device and serves it until it is shut down (control socket
/// `shutdown`, SIGTERM/SIGINT when not active swap, or the device being
/// deleted underneath). `ready` hears first.
pub fn run(cfg: DaemonConfig, ready: Ready) -> Result<(), String> {
    let ready = ReadyOnce(Arc::new(Mutex::new(Some(ready))));
    let r = serve(&cfg, &ready);
    if let Err(e) = &r {
        ready.fire(Err(e));
    }
    r
}

fn serve(cfg: &DaemonConfig, ready: &ReadyOnce) -> Result<(), String> {
    // Before any thread exists, so that all of them inherit it.
    safety::harden()?;
    let sigfd = block_signals()?;
    let io_buf_bytes = match cfg.io_buf_bytes {
        0 => params::auto_io_buf_bytes(
            cfg.queues.into(),
            cfg.depth.into(),
            params::mem_total().unwrap_or(0),
        ),
        n => n,
    };
    let shared = Arc::new(new_shared(cfg)?);
    let ctrl = UblkCtrlBuilder::default()
        .name("zblk")
        .id(cfg.id)
        .nr_queues(cfg.queues)
        .depth(cfg.depth)
        .io_buf_bytes(io_buf_bytes)
        .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV | UblkFlags::UBLK_DEV_F_MLOCK_IO_BUFFER)
        .build()
        .map_err(|e| format!("cannot create the ublk device: {}", ublk_error(&e)))?;
    let id = ctrl.dev_info().dev_id;
    // The driver may round the buffer size; requests follow its value.
    let io_buf_bytes = ctrl.dev_info().max_io_buf_bytes;
    if let Some(tmp) = &cfg.log_file {
        if let Err(e) = std::fs::rename(tmp, paths::log_path(id)) {
            log::warn!(
                "cannot rename {} to {}: {e}",
                tmp.display(),
                paths::log_path(id).display()
            );
        }
    }
    let (listener, guard) = bind_socket(id)?;
    let info = DeviceInfo {
        id,
        name: format!("ublkb{id}"),
        path: ctrl.get_bdev_path(),
        size: cfg.size,
        algorithm: cfg.algo.to_string(),
        group_pages: cfg.group_pages,
        mode: cfg.mode.to_string(),
        mem_limit: cfg.mem_limit,
        queues: cfg.queues,
        depth: cfg.depth,
        io_buf_bytes,
        pid: std::process::id(),
    };
    log::info!(
        "device {id}: {} bytes, {} queues x {} tags, {} KiB I/O buffers, {}",
        cfg.size,
        cfg.queues,
        cfg.depth,
        io_buf_bytes >> 10,
        info.algorithm
    );

    let size = cfg.size;
    let tgt_init = move |dev: &mut UblkDev| {
        dev.set_default_params(size);
        dev.tgt.params = params::device_params(size, dev.dev_info.max_io_buf_bytes);
        Ok(())
    };
    let qs = shared.clone();
    let q_fn = move |qid: u16, dev: &UblkDev| queue_thread(&qs, qid, dev);
    let cs = shared.clone();
    let ready2 = ready.clone();
    let dev_fn = move |ctrl: &UblkCtrl| {
        ready2.fire(Ok(&info));
        control_loop(&cs, &info, &listener, &sigfd);
        log::info!("device {}: stopping", info.id);
        if let Err(e) = ctrl.kill_dev() {
            log::warn!("stop device {}: {}", info.id, ublk_error(&e));
        }
        wait_queues_exit(&cs);
    };
    let r = ctrl.run_target(tgt_init, q_fn, dev_fn);
    // Deleting the device (dropping the control) before removing the
    // socket: once the socket is gone, `zblk del` knows the device is too.
    drop(ctrl);
    drop(guard);
    match r {
        Ok(_) => {
            log::info!("device {id}: deleted");
            Ok(())
        }
        Err(e) => Err(format!("device {id} failed to start: {}", ublk_error(&e))),
    }
}

/// Deletes device `id` whose daemon is gone (it left its socket behind:
/// killed, or crashed). Only for ids that have a zblk socket, so that a
/// device served by another ublk program is never touched.
pub fn delete_orphan(id: u32) -> Result<(), String> {
    let sock = paths::socket_path(id);
    if !sock.exists() {
        return Err(format!("device {id} has no zblk socket: not deleting it"));
    }
    let Ok(sid) = i32::try_from(id) else {
        return Err(format!("device id {id} is out of range"));
    };
    if paths::cdev_path(id).exists() {
        let ctrl =
            UblkCtrl::new_simple(sid).map_err(|e| format!("device {id}: {}", ublk_error(&e)))?;
        // Stopping may fail when the driver already stopped it.
        let _ = ctrl.kill_dev();
        // The synchronous delete waits for the kernel's last reference to
        // the disk, which a swap area left behind by a killed daemon never
        // drops: it would hang. The asynchronous one (Linux 6.9+) returns at
        // once and the device goes when its last user lets go; older
        // kernels get the synchronous one.
        if let Err(e) = ctrl.del_dev_async() {
            log::info!(
                "asynchronous delete of device {id} refused ({}); deleting synchronously",
                ublk_error(&e)
            );
            ctrl.del_dev()
                .map_err(|e| format!("cannot delete device {id}: {}", ublk_error(&e)))?;
        }
    }
    std::fs::remove_file(&sock).map_err(|e| format!("cannot remove {}: {e}", sock.display()))
}

/// A libublk error in words.
fn ublk_error(e: &libublk::UblkError) -> String {
    match e {
        libublk::UblkError::OtherError(errno) => {
            let what = std::io::Error::from_raw_os_error(errno.saturating_neg());
            match *errno {
                e if e == -libc::EPERM => {
                    format!("{what} (mlock of the I/O buffers failed, or not root)")
                }
                e if e == -libc::EEXIST => format!("{what} (that device id is taken)"),
                _ => what.to_string(),
            }
        }
        other => other.to_string(),
    }
}

fn new_shared(cfg: &DaemonConfig) -> Result<Shared, String> {
    let store = Store::new(StoreConfig {
        size: cfg.size,
        algo: cfg.algo,
        group_pages: cfg.group_pages,
        mode: cfg.mode,
        mem_limit: cfg.mem_limit,
        // The device may become swap at any time: zspages the slab reuses
        // after giving them back are locked again.
        mlock: true,
        ..StoreConfig::new(cfg.size)
    })
    .map_err(|e| e.to_string())?;
    let mut queues = Vec::new();
    let mut ctxs = Vec::new();
    for _ in 0..cfg.queues {
        // SAFETY: eventfd has no memory preconditions; a valid result is a
        // new descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(format!("eventfd: {}", std::io::Error::last_os_error()));
        }
        queues.push(QueueShared {
            // SAFETY: fd is a fresh descriptor owned by nobody else.
            kick: unsafe { OwnedFd::from_raw_fd(fd) },
            done: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            kick_buf: AtomicU64::new(0),
        });
        // Created in queue order so that stats list queue i as context i.
        ctxs.push(Some(store.new_ctx()));
    }
    Ok(Shared {
        store,
        alive: AtomicUsize::new(queues.len()),
        queues,
        ctxs: Mutex::new(ctxs),
        tick_gen: AtomicU64::new(0),
    })
}

/// Blocks SIGTERM and SIGINT in this thread (and the threads it will
/// create) and returns a signalfd that receives them.
fn block_signals() -> Result<OwnedFd, String> {
    // SAFETY: sigset manipulation on a local, zero-initialised set; the
    // signalfd result is checked and owned.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err("pthread_sigmask failed".into());
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(format!("signalfd: {}", std::io::Error::last_os_error()));
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

fn bind_socket(id: u32) -> Result<(UnixListener, SocketGuard), String> {
    use std::os::unix::fs::PermissionsExt;
    paths::ensure_run_dir().map_err(|e| format!("cannot create {}: {e}", paths::RUN_DIR))?;
    let path = paths::socket_path(id);
    // The driver just gave us this id, so a socket left there belongs to
    // a daemon that is gone.
    let _ = std::fs::remove_file(&path);
    let listener =
        UnixListener::bind(&path).map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
    let guard = SocketGuard(path.clone());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("chmod {}: {e}", path.display()))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((listener, guard))
}

/// Counts a queue thread out when it ends, however it ends.
struct AliveGuard<'a>(&'a AtomicUsize);

impl Drop for AliveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Body of queue thread `qid` (libublk has already made it an io-flusher).
fn queue_thread(shared: &Shared, qid: u16, dev: &UblkDev) {
    let _alive = AliveGuard(&shared.alive);
    let ctx = shared
        .ctxs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_mut(usize::from(qid))
        .and_then(Option::take);
    let (Some(ctx), Some(qs)) = (ctx, shared.queues.get(usize::from(qid))) else {
        log::error!("queue {qid}: no engine context");
        // Makes start_dev fail instead of waiting for this queue forever.
        dev.notify_buffer_registration_complete(true);
        return;
    };
    serve_queue(shared, qs, ctx, qid, dev);
}

fn serve_queue(shared: &Shared, qs: &QueueShared, mut ctx: QueueCtx, qid: u16, dev: &UblkDev) {
    let mut bufs = dev.alloc_queue_io_bufs();
    let q = match UblkQueue::new(qid, dev)
        .and_then(|q| q.submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs))))
    {
        Ok(q) => q,
        Err(e) => {
            log::error!("queue {qid}: setup failed: {}", ublk_error(&e));
            dev.notify_buffer_registration_complete(true);
            return;
        }
    };
    submit_tick_read(&q, qs);
    let mut rl = RateLimit::default();
    q.wait_and_handle_io(|q, tag, io| {
        if io.is_tgt_io() {
            if UblkIOCtx::user_data_to_op(io.user_data()) == TICK_OP {
                on_tick(shared, qs, &mut ctx);
                if io.result() >= 0 && !q.is_stopping() {
                    submit_tick_read(q, qs);
                }
            }
            return;
        }
        let iod = IoDesc::from(q.get_iod(tag));
        let Some(buf) = bufs.get_mut(usize::from(tag)) else {
            log::error!("queue {qid}: tag {tag} out of range");
            return;
        };
        let res = handle_io(&mut ctx, &iod, buf.as_mut_slice(), &mut rl);
        let done = q.complete_io_cmd_unified(
            tag,
            BufDesc::Slice(buf.as_slice()),
            Ok(UblkIORes::Result(res)),
        );
        if let Err(e) = done {
            log::error!("queue {qid}: completing tag {tag}: {}", ublk_error(&e));
        }
    });
    ctx.flush_frees();
    qs.pending.store(0, Ordering::SeqCst);
    log::info!("queue {qid}: done");
}

/// A queue's answer to a kick: only the queue's own thread may touch its
/// context, so it frees its batch here and publishes the generation the
/// control loop asked for.
fn on_tick(shared: &Shared, qs: &QueueShared, ctx: &mut QueueCtx) {
    let gen = shared.tick_gen.load(Ordering::SeqCst);
    ctx.flush_frees();
    qs.pending
        .store(ctx.pending_frees() as u64, Ordering::SeqCst);
    qs.done.store(gen, Ordering::SeqCst);
}

/// Queues a read of the kick eventfd on this thread's ring.
fn submit_tick_read(q: &UblkQueue, qs: &QueueShared) {
    // The kernel writes the counter into `kick_buf`, which lives in the
    // shared state: a read still pending when the queue thread ends never
    // lands on a dead stack frame.
    let buf = qs.kick_buf.as_ptr().cast::<u8>();
    let fd = io_uring::types::Fd(qs.kick.as_raw_fd());
    let sqe = io_uring::opcode::Read::new(fd, buf, 8)
        .build()
        .user_data(UblkIOCtx::build_user_data(0, TICK_OP, 0, true));
    if let Err(e) = q.ublk_submit_sqe_sync(sqe) {
        log::warn!(
            "queue {}: cannot arm the tick: {}",
            q.get_qid(),
            ublk_error(&e)
        );
    }
}

/// Serves the control socket and signals until the device should stop.
fn control_loop(shared: &Shared, info: &DeviceInfo, listener: &UnixListener, sigfd: &OwnedFd) {
    let bdev = PathBuf::from(&info.path);
    let mut last_tick = Instant::now();
    loop {
        if shared.alive.load(Ordering::SeqCst) == 0 {
            log::warn!("device {}: all queues ended", info.id);
            return;
        }
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sigfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a valid array of two pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, TICK.as_millis() as i32) };
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            log::error!("poll: {}", std::io::Error::last_os_error());
            std::thread::sleep(Duration::from_millis(100));
        }
        if last_tick.elapsed() >= TICK {
            shared.kick_all();
            last_tick = Instant::now();
        }
        if fds[1].revents & libc::POLLIN != 0 {
            if let Some(sig) = read_signal(sigfd) {
                match may_stop(&bdev, false) {
                    Ok(()) => {
                        log::info!("device {}: signal {sig}, shutting down", info.id);
                        return;
                    }
                    Err(e) => log::warn!("signal {sig} ignored: {e}"),
                }
            }
        }
        if fds[0].revents & libc::POLLIN != 0 {
            if let Ok((stream, _)) = listener.accept() {
                if serve_client(shared, info, &bdev, stream) {
                    return;
                }
            }
        }
    }
}

/// Reads one signal number from the signalfd.
fn read_signal(fd: &OwnedFd) -> Option<u32> {
    // SAFETY: signalfd_siginfo is plain data; we read at most its size.
    let mut si: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let sz = std::mem::size_of::<libc::signalfd_siginfo>();
    // SAFETY: reading into a properly sized local buffer.
    let n = unsafe {
        libc::read(
            fd.as_raw_fd(),
            (&mut si as *mut libc::signalfd_siginfo).cast(),
            sz,
        )
    };
    (n == sz as isize).then_some(si.ssi_signo)
}

/// Whether the device may stop now: not while it is active swap, unless
/// forced (stopping it would lose every page swapped to it).
fn may_stop(bdev: &Path, force: bool) -> Result<(), String> {
    if !force && swap::is_active_swap(bdev) {
        return Err(format!(
            "{} is active swap: swapoff it first (or zblk del --force)",
            bdev.display()
        ));
    }
    Ok(())
}

/// Answers one client; returns true when the daemon should stop.
fn serve_client(shared: &Shared, info: &DeviceInfo, bdev: &Path, mut s: UnixStream) -> bool {
    let setup = s
        .set_nonblocking(false)
        .and_then(|()| s.set_read_timeout(Some(Duration::from_secs(2))))
        .and_then(|()| s.set_write_timeout(Some(Duration::from_secs(2))));
    if let Err(e) = setup {
        log::warn!("control client: {e}");
        return false;
    }
    let (resp, stop) = match control::read_request(&mut s) {
        Ok(req) => answer(shared, info, bdev, req),
        Err(e) => (Response::err(e), false),
    };
    if let Err(e) = control::write_response(&mut s, &resp) {
        log::warn!("control client: {e}");
    }
    stop
}

/// The reply to one request, and whether to stop afterwards.
fn answer(shared: &Shared, info: &DeviceInfo, bdev: &Path, req: Request) -> (Response, bool) {
    let json = |v: Result<serde_json::Value, serde_json::Error>| match v {
        Ok(v) => Response::ok(v),
        Err(e) => Response::err(e.to_string()),
    };
    match req {
        Request::Info => (json(serde_json::to_value(info)), false),
        Request::Stats => {
            // Handles a queue could not hand over in time are still pending,
            // on top of what the store's drain has not freed yet.
            let pending = shared.flush_all();
            let mut stats = shared.store.stats();
            stats.deferred_free_pending += pending;
            (
                json(
                    serde_json::to_value(&stats)
                        .map(|s| serde_json::json!({"device": info, "stats": s})),
                ),
                false,
            )
        }
        Request::Compact => {
            shared.flush_all();
            let n = shared.store.compact();
            log::info!("device {}: compaction gave back {n} pages", info.id);
            (
                Response::ok(serde_json::json!({ "pages_compacted": n })),
                false,
            )
        }
        Request::SetMemLimit { bytes } => {
            shared.store.set_mem_limit(bytes);
            log::info!("device {}: mem_limit set to {bytes}", info.id);
            (
                Response::ok(serde_json::json!({ "mem_limit": bytes })),
                false,
            )
        }
        Request::Shutdown { force } => match may_stop(bdev, force) {
            Ok(()) => (Response::ok(serde_json::Value::Null), true),
            Err(e) => (Response::err(e), false),
        },
    }
}

/// Keeps kicking the queues (so none sleeps in its ring wait) until all
/// their threads have ended.
fn wait_queues_exit(shared: &Shared) {
    let t0 = Instant::now();
    while shared.alive.load(Ordering::SeqCst) > 0 {
        if t0.elapsed() > STOP_WAIT {
            log::error!("queues did not stop within {STOP_WAIT:?}");
            return;
        }
        shared.kick_all();
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::AtomicBool;
    use zblk::PAGE_SIZE;

    fn cfg(queues: u16) -> DaemonConfig {
        DaemonConfig {
            id: 0,
            size: 256 * PAGE_SIZE as u64,
            algo: Algo::Lz4,
            group_pages: 8,
            mode: Mode::PerPage,
            mem_limit: 0,
            queues,
            depth: 4,
            io_buf_bytes: 1 << 20,
            log_file: None,
        }
    }

    fn info() -> DeviceInfo {
        DeviceInfo {
            id: 0,
            name: "ublkb4094".into(),
            path: "/dev/ublkb4094".into(),
            size: 256 * PAGE_SIZE as u64,
            algorithm: "lz4".into(),
            group_pages: 8,
            mode: "per-page".into(),
            mem_limit: 0,
            queues: 2,
            depth: 4,
            io_buf_bytes: 1 << 20,
            pid: std::process::id(),
        }
    }

    /// Stands in for a queue thread: does some I/O with its context, then
    /// answers kicks on its eventfd as the real queue does, until a kick
    /// finds `stop` set.
    fn fake_queue(
        shared: Arc<Shared>,
        qid: usize,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut ctx = shared.ctxs.lock().unwrap()[qid].take().unwrap();
            let page: Vec<u8> = (0..PAGE_SIZE)
                .map(|i| (i % 251) as u8 ^ qid as u8)
                .collect();
            let base = (qid * 100 * PAGE_SIZE) as u64;
            for i in 0..10u64 {
                ctx.write(base + i * PAGE_SIZE as u64, &page).unwrap();
            }
            // Ten handles detached: fewer than a free batch, so they wait.
            ctx.discard(base, 10 * PAGE_SIZE as u64).unwrap();
            assert_eq!(ctx.pending_frees(), 10);
            let qs = &shared.queues[qid];
            loop {
                let mut b = [0u8; 8];
                // SAFETY: blocking read of 8 bytes from our eventfd.
                let n = unsafe { libc::read(qs.kick.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
                assert_eq!(n, 8);
                on_tick(&shared, qs, &mut ctx);
                if stop.load(Ordering::SeqCst) {
                    shared.alive.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
            }
        })
    }

    fn ask(shared: &Shared, req: Request) -> (Response, bool) {
        answer(shared, &info(), Path::new("/dev/ublkb4094"), req)
    }

    #[test]
    fn stats_wait_for_every_queue_to_free_its_batch() {
        let shared = Arc::new(new_shared(&cfg(2)).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let qs: Vec<_> = (0..2)
            .map(|q| fake_queue(shared.clone(), q, stop.clone()))
            .collect();
        // Wait until both fake queues have done their I/O.
        while shared.store.stats().counters.notify_free < 20 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let held = shared.store.stats().mem_used_total;
        assert!(held > 0, "batched objects still held");
        let (r, stop_now) = ask(&shared, Request::Stats);
        assert!(r.ok && !stop_now, "{r:?}");
        let s = &r.data["stats"];
        assert_eq!(s["deferred_free_pending"], 0);
        let after = s["mem_used_total"].as_u64().unwrap();
        assert!(
            after < held,
            "batches freed before the snapshot: {after} < {held}"
        );
        assert_eq!(s["stored_pages"], 0);
        assert_eq!(s["queues"].as_array().unwrap().len(), 2);
        assert_eq!(s["queues"][1]["pages_written"], 10);
        assert_eq!(r.data["device"]["name"], "ublkb4094");

        stop.store(true, Ordering::SeqCst);
        wait_queues_exit(&shared);
        for q in qs {
            q.join().unwrap();
        }
        assert_eq!(shared.alive.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn compact_mem_limit_info_and_shutdown() {
        let shared = new_shared(&cfg(1)).unwrap();
        shared.alive.store(0, Ordering::SeqCst); // no queue threads here
        let (r, _) = ask(&shared, Request::SetMemLimit { bytes: 1 << 20 });
        assert!(r.ok);
        assert_eq!(shared.store.stats().mem_limit, 1 << 20);
        let (r, _) = ask(&shared, Request::Compact);
        assert!(r.ok && r.data["pages_compacted"].is_u64(), "{r:?}");
        let (r, _) = ask(&shared, Request::Info);
        assert_eq!(
            serde_json::from_value::<DeviceInfo>(r.data).unwrap(),
            info()
        );
        // Not swap (the node does not even exist): shutdown is accepted.
        let (r, stop) = ask(&shared, Request::Shutdown { force: false });
        assert!(r.ok && stop);
    }

    #[test]
    fn orphans_need_a_zblk_socket() {
        let e = delete_orphan(1_000_000).unwrap_err();
        assert!(e.contains("has no zblk socket"), "{e}");
    }

    #[test]
    fn a_client_gets_one_reply_line() {
        let shared = new_shared(&cfg(1)).unwrap();
        shared.alive.store(0, Ordering::SeqCst);
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"{\"cmd\":\"stats\"}\n").unwrap();
        assert!(!serve_client(
            &shared,
            &info(),
            Path::new("/dev/ublkb4094"),
            b
        ));
        let mut line = String::new();
        BufReader::new(&a).read_line(&mut line).unwrap();
        let r: Response = serde_json::from_str(&line).unwrap();
        assert!(r.ok);
        assert_eq!(r.data["stats"]["disksize"], 256 * PAGE_SIZE as u64);

        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"not json\n").unwrap();
        assert!(!serve_client(
            &shared,
            &info(),
            Path::new("/dev/ublkb4094"),
            b
        ));
        let mut line = String::new();
        BufReader::new(&a).read_line(&mut line).unwrap();
        let r: Response = serde_json::from_str(&line).unwrap();
        assert!(!r.ok && r.error.unwrap().contains("bad request"));
    }
}
