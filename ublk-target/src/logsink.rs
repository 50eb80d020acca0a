//! Logging that never blocks the thread that logs.
//!
//! A daemon's stderr is a file on `/run` (tmpfs) or a pipe to the journal.
//! Tmpfs pages are swappable, and swap may be the very device the daemon
//! serves: a queue thread that logs a failed request can find the log
//! file's page swapped out, wait for it to be read back, and that read (or
//! the write still in flight for it) waits on the queue thread, and every
//! swap write behind it. A journal that stops reading under memory
//! pressure blocks a pipe the same way.
//!
//! So the daemon's log records go to a bounded in-memory queue and one
//! thread of its own (`zblk-log`) writes them out; when the queue is full
//! a record is dropped and counted, and the next one written says how many
//! were lost. Only that thread ever waits on stderr.

use crossbeam_queue::ArrayQueue;
use std::io::Write;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Relaxed, SeqCst},
};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Records held while the writer is behind (or not started yet).
const QUEUE: usize = 1024;
/// How often the writer looks without being woken.
const PERIOD: Duration = Duration::from_millis(500);

struct Shared {
    records: ArrayQueue<Vec<u8>>,
    dropped: AtomicU64,
    /// Records queued and records written so far.
    queued: AtomicU64,
    written: AtomicU64,
    /// Where records go: taken by the writer thread when it starts.
    out: Mutex<Option<Box<dyn Write + Send>>>,
    writer: OnceLock<Thread>,
}

/// The process's sink, for [`start_writer`] and [`flush`].
static SINK: OnceLock<Arc<Shared>> = OnceLock::new();

/// A `Write` for `env_logger::Target::Pipe`: each write queues its bytes
/// for the writer thread and returns at once. One write is one record
/// (env_logger writes each formatted record with one call); a record that
/// does not fit is dropped whole.
///
/// The writer thread starts only when the process calls [`start_writer`],
/// after it hardened itself, dropped its capabilities and blocked its stop
/// signals: capabilities are per thread, and a thread started before would
/// keep them all (and take a SIGTERM meant for the main thread's handler).
/// Records logged before wait in the queue.
pub struct LogSink {
    shared: Arc<Shared>,
}

impl LogSink {
    /// A sink whose records go to `out` (the process's stderr), made the
    /// process's sink for [`start_writer`] and [`flush`] (the first one
    /// made is).
    pub fn new(out: Box<dyn Write + Send>) -> LogSink {
        let shared = Arc::new(Shared {
            records: ArrayQueue::new(QUEUE),
            dropped: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            written: AtomicU64::new(0),
            out: Mutex::new(Some(out)),
            writer: OnceLock::new(),
        });
        let _ = SINK.set(shared.clone());
        LogSink { shared }
    }
}

impl Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.shared.records.push(buf.to_vec()).is_ok() {
            self.shared.queued.fetch_add(1, SeqCst);
        } else {
            self.shared.dropped.fetch_add(1, Relaxed);
        }
        if let Some(w) = self.shared.writer.get() {
            w.unpark();
        }
        Ok(buf.len())
    }

    /// Returns at once: flushing waits on stderr, which only the writer
    /// thread may do.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Starts the process's log writer thread (`zblk-log`) if there is a sink
/// and it has none yet; its stop signals are blocked. Call it once the
/// process dropped what it does not keep (see [`LogSink`]). Logged and
/// ignored if the thread cannot start (records then wait for [`flush`]).
pub fn start_writer() {
    let Some(shared) = SINK.get() else {
        return;
    };
    if shared.writer.get().is_some() {
        return;
    }
    let sh = shared.clone();
    // The thread takes the output itself: if it cannot start, the output
    // stays for `flush`.
    match std::thread::Builder::new()
        .name("zblk-log".into())
        .spawn(move || {
            block_signals();
            let out = sh.out.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(out) = out {
                write_loop(&sh, out);
            }
        }) {
        Ok(t) => {
            let _ = shared.writer.set(t.thread().clone());
            t.thread().unpark();
        }
        Err(e) => eprintln!("zblk: cannot start the log writer thread: {e}"),
    }
}

/// Waits up to `timeout` until every record queued so far is written; with
/// no writer thread, writes them on the calling thread.
pub fn flush(timeout: Duration) {
    let Some(shared) = SINK.get() else {
        return;
    };
    if let Some(out) = shared
        .out
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
    {
        drain(shared, out);
        return;
    }
    let end = Instant::now() + timeout;
    let target = shared.queued.load(SeqCst);
    if let Some(w) = shared.writer.get() {
        w.unpark();
    }
    while shared.written.load(SeqCst) < target || shared.dropped.load(Relaxed) > 0 {
        if Instant::now() >= end {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Blocks every signal on the calling thread: the writer never takes a
/// signal meant for the process's handlers.
fn block_signals() {
    // SAFETY: sigfillset initialises the set it is given; pthread_sigmask
    // reads it and changes only the calling thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

fn write_loop(shared: &Shared, mut out: Box<dyn Write + Send>) {
    loop {
        drain(shared, &mut out);
        if shared.records.is_empty() {
            std::thread::park_timeout(PERIOD);
        }
    }
}

/// Writes every queued record to `out`, saying where records were dropped
/// (records lost after the last one written are said too), and flushes.
fn drain(shared: &Shared, out: &mut Box<dyn Write + Send>) {
    while let Some(r) = shared.records.pop() {
        say_dropped(shared, out);
        let _ = out.write_all(&r);
        shared.written.fetch_add(1, SeqCst);
    }
    say_dropped(shared, out);
    let _ = out.flush();
}

/// Writes how many records were dropped since it last said, if any.
fn say_dropped(shared: &Shared, out: &mut Box<dyn Write + Send>) {
    let lost = shared.dropped.swap(0, Relaxed);
    if lost > 0 {
        let _ = writeln!(
            out,
            "zblk: {lost} log records dropped (the log was not written fast enough)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>, Arc<AtomicBool>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            while self.1.load(Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
            }
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Records logged before the writer starts wait for it; records come
    /// out in order; a writer stuck on its output blocks no one who logs,
    /// and what did not fit is counted and said.
    #[test]
    fn records_in_order_and_a_stuck_output_blocks_nobody() {
        let out = Shared::default();
        let mut sink = LogSink::new(Box::new(out.clone()));
        for i in 0..10 {
            sink.write_all(format!("record {i}\n").as_bytes()).unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            out.0.lock().unwrap().is_empty(),
            "written before the writer started"
        );
        start_writer();
        flush(Duration::from_secs(5));
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let want: String = (0..10).map(|i| format!("record {i}\n")).collect();
        assert_eq!(text, want);
        // Stuck output: logging many more records than the queue holds
        // returns at once.
        out.1.store(true, Relaxed);
        let t = Instant::now();
        for i in 0..(3 * QUEUE) {
            sink.write_all(format!("more {i}\n").as_bytes()).unwrap();
        }
        assert!(t.elapsed() < Duration::from_secs(2), "logging blocked");
        out.1.store(false, Relaxed);
        flush(Duration::from_secs(5));
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        // Every record is either written or counted as dropped.
        let kept = text.lines().filter(|l| l.starts_with("more ")).count();
        let dropped: usize = text
            .lines()
            .filter_map(|l| l.strip_prefix("zblk: "))
            .filter_map(|l| l.split(' ').next()?.parse::<usize>().ok())
            .sum();
        assert!(dropped > 0, "nothing dropped: {kept} kept");
        assert_eq!(kept + dropped, 3 * QUEUE);
    }
}
