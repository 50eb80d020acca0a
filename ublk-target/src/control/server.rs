//! The daemon side of the control socket: binds `/run/zblk/<id>.sock` and
//! answers one request per connection.

use super::{
    read_request, refuse_non_root, write_response, DeviceInfo, Request, Response, DUMP_CHUNK,
    SLOTS_BATCH,
};
use crate::error::{Error, Result, Step};
use crate::policy::{Policy, Update};
use crate::queue::Queues;
use crate::{paths, swap};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a client may take to send its request or read the reply.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// What the control loop does after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Go on serving.
    Serve,
    /// Stop and delete the device.
    Stop,
    /// Stop serving and leave the device to the next daemon.
    Handover,
}

/// A device's listening control socket, removed when dropped.
pub struct ControlSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl ControlSocket {
    /// Binds the socket of device `id` (mode 0600 in the 0700 run
    /// directory), non-blocking.
    pub fn bind(id: u32) -> Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        paths::ensure_run_dir().map_err(Error::os(Step::RunDir))?;
        let path = paths::socket_path(id);
        // The driver just gave us this id, so a socket left there belongs
        // to a daemon that is gone.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(Error::os(Step::Bind(path.clone())))?;
        let sock = ControlSocket { listener, path };
        std::fs::set_permissions(&sock.path, std::fs::Permissions::from_mode(0o600))
            .map_err(Error::os(Step::Chmod(sock.path.clone())))?;
        sock.listener
            .set_nonblocking(true)
            .map_err(Error::os(Step::Nonblocking(sock.path.clone())))?;
        Ok(sock)
    }

    /// The descriptor to poll for clients.
    pub fn fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    /// Answers the client waiting, if any; says what to do next.
    pub fn serve_one(&self, queues: &Queues, policy: &Policy, info: &DeviceInfo) -> Next {
        match self.listener.accept() {
            Ok((stream, _)) => serve_client(queues, policy, info, stream),
            Err(_) => Next::Serve,
        }
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether the device may stop now: not while it is active swap, unless
/// forced (stopping it would lose every page swapped to it).
pub fn may_stop(bdev: &Path, force: bool) -> Result<()> {
    if !force && swap::is_active_swap(bdev) {
        return Err(Error::ActiveSwap(bdev.to_path_buf()));
    }
    Ok(())
}

/// Answers one client; says what the daemon does next.
fn serve_client(queues: &Queues, policy: &Policy, info: &DeviceInfo, mut s: UnixStream) -> Next {
    let setup = s
        .set_nonblocking(false)
        .and_then(|()| s.set_read_timeout(Some(CLIENT_TIMEOUT)))
        .and_then(|()| s.set_write_timeout(Some(CLIENT_TIMEOUT)));
    if let Err(e) = setup {
        log::warn!("control client: {e}");
        return Next::Serve;
    }
    if refuse_non_root(&mut s) {
        return Next::Serve;
    }
    let (resp, stop) = match read_request(&mut s) {
        Ok(req) => answer(queues, policy, info, req),
        Err(e) => (Response::err(e.to_string()), Next::Serve),
    };
    if let Err(e) = write_response(&mut s, &resp) {
        log::warn!("control client: {e}");
    }
    stop
}

/// `data` as a reply, or the reason it cannot be one.
fn json_reply(v: serde_json::Result<serde_json::Value>) -> Response {
    match v {
        Ok(v) => Response::ok(v),
        Err(e) => Response::err(e.to_string()),
    }
}

/// A maintenance pass's `report` as a reply, with the pages the compaction
/// after it gave back (`pages_compacted`).
fn compacted_reply(report: impl serde::Serialize, compacted: u64) -> Response {
    json_reply(serde_json::to_value(report).map(|mut v| {
        v["pages_compacted"] = serde_json::json!(compacted);
        v
    }))
}

/// Compacts the backing store: its report, with `bd_used_bytes` before
/// and after and `bd_bytes`, the figures it is judged by.
fn compact_backing(queues: &Queues, info: &DeviceInfo, max_blocks: u64) -> Response {
    let store = queues.store();
    let before = store.stats().bd_used_bytes;
    let max = if max_blocks == 0 {
        u64::MAX
    } else {
        max_blocks
    };
    let report = match store.compact_backing(max) {
        Ok(r) => r,
        Err(e) => return Response::err(e.to_string()),
    };
    let after = store.stats();
    log::info!(
        "device {}: backing compaction freed {} blocks",
        info.id(),
        report.blocks_freed
    );
    json_reply(serde_json::to_value(report).map(|mut v| {
        v["bd_used_bytes_before"] = serde_json::json!(before);
        v["bd_used_bytes"] = serde_json::json!(after.bd_used_bytes);
        v["bd_bytes"] = serde_json::json!(after.counters.bd_bytes);
        v
    }))
}

/// The reply to one request, and what to do afterwards. A maintenance
/// job holds the device's maintenance lock, as a policy round does.
fn answer(queues: &Queues, policy: &Policy, info: &DeviceInfo, req: Request) -> (Response, Next) {
    let _one_job = matches!(
        req,
        Request::Compact
            | Request::CompactBacking { .. }
            | Request::Idle { .. }
            | Request::Recompress { .. }
            | Request::Writeback { .. }
    )
    .then(|| queues.maintenance());
    let reply = match req {
        Request::Info => json_reply(serde_json::to_value(info)),
        Request::Stats => stats(queues, policy, info),
        Request::SetPolicy {
            recompress_idle_after,
            writeback_idle_after,
            recompress_algo,
        } => set_policy(
            queues,
            policy,
            info,
            recompress_idle_after,
            writeback_idle_after,
            recompress_algo.as_deref(),
        ),
        Request::Compact => {
            queues.flush_all();
            let n = queues.store().compact();
            log::info!("device {}: compaction gave back {n} pages", info.id());
            Response::ok(serde_json::json!({ "pages_compacted": n }))
        }
        Request::CompactBacking { max_blocks } => compact_backing(queues, info, max_blocks),
        Request::Idle { age, exact } => idle(queues, info, age, exact),
        Request::Recompress {
            algo,
            priority,
            kind,
            threshold,
            max_pages,
            pages,
        } => recompress(
            queues,
            policy,
            info,
            Choice {
                algo: &algo,
                priority,
            },
            Which {
                kind: &kind,
                threshold,
                max_pages,
                pages: &pages,
            },
        ),
        Request::Writeback { kind, pages, limit } => {
            writeback(queues, info, kind.as_deref(), &pages, limit)
        }
        Request::Dump { start, count } => dump(queues, start, count),
        Request::Slots { pages } => slots(queues, &pages),
        Request::Sample { bytes } => {
            let bytes = bytes.min(zblk::MAX_DICT_BYTES as u64) as usize;
            let sample = queues.store().sample(bytes);
            Response::ok(serde_json::json!({ "sample": sample }))
        }
        Request::SetWritebackLimit { pages } => {
            queues.store().set_writeback_limit(pages);
            log::info!(
                "device {}: writeback_limit set to {pages} pages (0: off)",
                info.id()
            );
            Response::ok(serde_json::json!({ "writeback_limit": pages }))
        }
        Request::SetMemLimit { bytes } => {
            queues.store().set_mem_limit(bytes);
            log::info!("device {}: mem_limit set to {bytes}", info.id());
            Response::ok(serde_json::json!({ "mem_limit": bytes }))
        }
        Request::Shutdown { force } => {
            return match may_stop(Path::new(&info.path), force) {
                Ok(()) => (Response::ok(serde_json::Value::Null), Next::Stop),
                Err(e) => (Response::err(e.to_string()), Next::Serve),
            };
        }
        Request::Handover if info.recovery.is_on() => {
            log::info!("device {}: handing over to a new daemon", info.id());
            return (Response::ok(serde_json::Value::Null), Next::Handover);
        }
        Request::Handover => Response::err(format!(
            "device {} has no recovery: it cannot be handed over",
            info.id()
        )),
    };
    (reply, Next::Serve)
}

/// Marks pages idle: those not accessed for `age` seconds (none: all),
/// and with `exact` clears the marks of the others.
fn idle(queues: &Queues, info: &DeviceInfo, age: Option<u64>, exact: bool) -> Response {
    let store = queues.store();
    let done = match (age, exact) {
        (Some(age), true) => store
            .remark_idle(age)
            .map(|(marked, cleared)| serde_json::json!({ "marked": marked, "cleared": cleared })),
        (None, true) => return Response::err("idle: exact needs an age"),
        (age, false) => store
            .mark_idle(age)
            .map(|marked| serde_json::json!({ "marked": marked })),
    };
    match done {
        Ok(r) => {
            log::info!("device {}: idle marks: {r}", info.id());
            Response::ok(r)
        }
        Err(e) => Response::err(e.to_string()),
    }
}

/// What a `recompress` request names: one algorithm, an entry of the
/// device's list, or (neither) the whole list.
struct Choice<'a> {
    algo: &'a str,
    priority: Option<u8>,
}

impl Choice<'_> {
    /// The algorithms to try, in order: the one named, else those of the
    /// idle policy's list (`--recompress-algos`, else the store's).
    fn algos(
        &self,
        policy: &Policy,
        store: &zblk::Store,
    ) -> std::result::Result<Vec<zblk::Algo>, String> {
        if !self.algo.is_empty() {
            if self.priority.is_some() {
                return Err("give --algo or --priority, not both".into());
            }
            return Ok(vec![self.algo.parse()?]);
        }
        let Some(list) = policy.algos(store) else {
            return Err(
                "this device has no secondary algorithms: give --algo ALGO, \
                        or set them with zblk set --recompress-algos"
                    .into(),
            );
        };
        match self.priority {
            Some(n) => Ok(vec![list.priority(usize::from(n))?]),
            None => Ok(list.as_slice().to_vec()),
        }
    }
}

/// Which pages a `recompress` request names: a type, a least size, a
/// most count, page ranges.
struct Which<'a> {
    kind: &'a str,
    threshold: u64,
    max_pages: u64,
    pages: &'a [String],
}

/// Runs a recompression from the control loop, as compaction runs: the
/// engine works under slot locks, with its own thread state.
fn recompress(
    queues: &Queues,
    policy: &Policy,
    info: &DeviceInfo,
    choice: Choice<'_>,
    which: Which<'_>,
) -> Response {
    let parsed = choice.algos(policy, queues.store()).and_then(|algos| {
        Ok(zblk::Recompress {
            algos,
            kind: which.kind.parse()?,
            threshold: usize::try_from(which.threshold).map_err(|e| e.to_string())?,
            max_pages: which.max_pages,
            pages: page_ranges(which.pages)?,
        })
    });
    let p = match parsed {
        Ok(p) => p,
        Err(e) => return Response::err(e),
    };
    match queues.store().recompress(&p) {
        Ok(r) => {
            // The old objects are freed all over their zspages, whose
            // memory only a compaction gives back: compacting here makes
            // the memory a recompression saves show at once.
            queues.flush_all();
            let compacted = queues.store().compact();
            log::info!(
                "device {}: recompressed {} of {} pages with {}, {} bytes saved, \
                 compaction gave back {compacted} pages",
                info.id(),
                r.recompressed,
                r.tried,
                zblk::AlgoList::new(&p.algos)
                    .map(|l| l.to_string())
                    .unwrap_or_default(),
                r.saved_bytes
            );
            compacted_reply(r, compacted)
        }
        Err(e) => Response::err(e.to_string()),
    }
}

/// Which pages a writeback request names: a type or page ranges, not both.
fn writeback_select(
    kind: Option<&str>,
    pages: &[String],
) -> std::result::Result<zblk::WritebackSelect, String> {
    match (kind, pages.is_empty()) {
        (Some(_), false) => Err("writeback: a type and page ranges do not combine".into()),
        (None, true) => Err("writeback: give a type or page ranges".into()),
        (Some(k), true) => Ok(zblk::WritebackSelect::Type(k.parse()?)),
        (None, false) => Ok(zblk::WritebackSelect::Pages(page_ranges(pages)?)),
    }
}

/// The page ranges of a request (`N` or `LOW-HIGH` each).
fn page_ranges(pages: &[String]) -> std::result::Result<Vec<zblk::PageRange>, String> {
    pages.iter().map(|p| p.parse()).collect()
}

/// Runs a writeback from the control loop, as recompression runs: off the
/// queue threads; the engine does its I/O with no slot lock held, so
/// swap-ins go on meanwhile.
fn writeback(
    queues: &Queues,
    info: &DeviceInfo,
    kind: Option<&str>,
    pages: &[String],
    limit: u64,
) -> Response {
    let select = match writeback_select(kind, pages) {
        Ok(s) => s,
        Err(e) => return Response::err(e),
    };
    match queues.store().writeback(&zblk::Writeback { select, limit }) {
        Ok(r) => {
            // As after recompression: the freed objects are all over
            // their zspages, which only compaction gives back.
            queues.flush_all();
            let compacted = queues.store().compact();
            log::info!(
                "device {}: wrote back {} of {} pages ({} bytes in {} blocks){}{}, \
                 compaction gave back {compacted} pages",
                info.id(),
                r.written,
                r.selected,
                r.bytes,
                r.blocks,
                if r.full { ", backing device full" } else { "" },
                if r.limited {
                    ", writeback limit reached"
                } else {
                    ""
                },
            );
            compacted_reply(r, compacted)
        }
        Err(e) => Response::err(e.to_string()),
    }
}

/// One chunk of the device's slot states from page `start` on, and where
/// the next one starts (null at the device's end). No maintenance lock:
/// the engine locks one slot at a time.
fn dump(queues: &Queues, start: u64, count: u64) -> Response {
    let pages = queues.store().size() / zblk::PAGE_SIZE_U64;
    if start > pages {
        return Response::err(format!(
            "dump: page {start} is past the device's end ({pages} pages)"
        ));
    }
    let count = if count == 0 {
        DUMP_CHUNK
    } else {
        count.min(DUMP_CHUNK)
    };
    let end = start.saturating_add(count).min(pages);
    let slots = queues.store().slot_states(start..end);
    let next = (end < pages).then_some(end);
    json_reply(serde_json::to_value(&slots).map(|s| serde_json::json!({"slots": s, "next": next})))
}

/// The slot states of the stored pages among `pages`, in the order
/// asked; more than [`SLOTS_BATCH`] pages are refused. No maintenance
/// lock: the engine locks one slot at a time.
fn slots(queues: &Queues, pages: &[u64]) -> Response {
    if pages.len() > SLOTS_BATCH {
        return Response::err(format!(
            "slots: {} pages asked, at most {SLOTS_BATCH} a request",
            pages.len()
        ));
    }
    let slots = queues.store().slot_states_at(pages);
    json_reply(serde_json::to_value(&slots).map(|s| serde_json::json!({ "slots": s })))
}

/// Changes the idle policy; replies with its report, or why not.
fn set_policy(
    queues: &Queues,
    policy: &Policy,
    info: &DeviceInfo,
    recompress_idle_after: Option<u64>,
    writeback_idle_after: Option<u64>,
    recompress_algo: Option<&str>,
) -> Response {
    let algo = match recompress_algo
        .map(str::parse::<zblk::AlgoList>)
        .transpose()
    {
        Ok(a) => a,
        Err(e) => return Response::err(e),
    };
    let u = Update {
        recompress_idle_after,
        writeback_idle_after,
        recompress_algo: algo,
    };
    match policy.set(queues.store(), u) {
        Ok(s) => {
            log::info!(
                "device {}: idle policy: recompress after {} s, write back after {} s (0: off)",
                info.id(),
                s.recompress_idle_after,
                s.writeback_idle_after
            );
            json_reply(serde_json::to_value(policy.report(queues.store())))
        }
        Err(e) => Response::err(e),
    }
}

/// `{"device": .., "stats": .., "policy": ..}`, after every queue has
/// freed its batch.
fn stats(queues: &Queues, policy: &Policy, info: &DeviceInfo) -> Response {
    // Handles a queue could not hand over in time are still pending, on
    // top of what the store's drain has not freed yet.
    let pending = queues.flush_all();
    let mut stats = queues.store().stats();
    stats.deferred_free_pending += pending;
    let report = policy.report(queues.store());
    json_reply(serde_json::to_value(&stats).and_then(|mut s| {
        let p = serde_json::to_value(report)?;
        let mut device = serde_json::to_value(info)?;
        // The limit in force: `set --mem-limit` (or a recovered store's
        // last one) changes it after the device was made.
        device["mem_limit"] = stats.mem_limit.into();
        // The store is this process's only shared memory.
        s["mem_huge"] = zblk::huge_mapped_bytes().into();
        Ok(serde_json::json!({"device": device, "stats": s, "policy": p}))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DeviceConfig;
    use crate::queue::fake;
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::AtomicBool;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use zblk::PAGE_SIZE;

    fn cfg(queues: u16) -> DeviceConfig {
        let q = queues.to_string();
        let flags = ["-n", "0", "-s", "1M", "-q", &q, "-d", "4", "--io-buf", "1M"];
        DeviceConfig::from_flags(flags).unwrap()
    }

    fn info() -> DeviceInfo {
        DeviceInfo {
            name: "ublkb4094".into(),
            path: "/dev/ublkb4094".into(),
            config: cfg(2),
            pid: std::process::id(),
            recovery: crate::features::Recovery::Reissue,
            features: vec!["USER_RECOVERY".into()],
            transport: crate::transport::Transport::Batch,
        }
    }

    fn ask(queues: &Queues, req: Request) -> (Response, Next) {
        answer(queues, &off(), &info(), req)
    }

    /// A policy that is off.
    fn off() -> Policy {
        Policy::new(Default::default(), Default::default())
    }

    #[test]
    fn stats_wait_for_every_queue_to_free_its_batch() {
        let shared = Arc::new(Queues::new(&cfg(2)).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let qs: Vec<_> = (0..2)
            .map(|q| fake::queue(shared.clone(), q, stop.clone()))
            .collect();
        // Wait until both fake queues have done their I/O.
        while shared.store().stats().counters.notify_free < 20 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let held = shared.store().stats().mem_used_total;
        assert!(held > 0, "batched objects still held");
        let (r, stop_now) = ask(&shared, Request::Stats);
        assert!(r.ok && stop_now == Next::Serve, "{r:?}");
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
        shared.wait_exit();
        for q in qs {
            q.join().unwrap();
        }
        assert_eq!(shared.alive(), 0);
    }

    #[test]
    fn compact_mem_limit_info_and_shutdown() {
        let shared = Queues::new(&cfg(1)).unwrap();
        fake::no_threads(&shared);
        let (r, _) = ask(&shared, Request::SetMemLimit { bytes: 1 << 20 });
        assert!(r.ok);
        assert_eq!(shared.store().stats().mem_limit, 1 << 20);
        let (r, _) = ask(&shared, Request::Stats);
        assert_eq!(r.data["device"]["mem_limit"], 1 << 20, "the limit in force");
        let (r, _) = ask(&shared, Request::Compact);
        assert!(r.ok && r.data["pages_compacted"].is_u64(), "{r:?}");
        let (r, _) = ask(&shared, Request::Info);
        assert_eq!(
            serde_json::from_value::<DeviceInfo>(r.data).unwrap(),
            info()
        );
        // Not swap (the node does not even exist): shutdown is accepted.
        let (r, stop) = ask(&shared, Request::Shutdown { force: false });
        assert!(r.ok && stop == Next::Stop);
        let (r, next) = ask(&shared, Request::Handover);
        assert!(r.ok && next == Next::Handover);
        let off_info = DeviceInfo {
            recovery: crate::features::Recovery::Off,
            ..info()
        };
        let (r, next) = answer(&shared, &off(), &off_info, Request::Handover);
        assert!(!r.ok && next == Next::Serve, "{r:?}");
    }

    #[test]
    fn idle_and_recompress_through_the_control_loop() {
        let store = zblk::Store::new(cfg(1).store_config()).unwrap();
        let shared = Queues::with_store(&cfg(1), store.clone()).unwrap();
        fake::no_threads(&shared);
        let mut ctx = store.new_ctx();
        let text: Vec<u8> = b"idle pages of text, recompressed; "
            .iter()
            .copied()
            .cycle()
            .take(4 * PAGE_SIZE)
            .collect();
        ctx.write(0, &text).unwrap();
        let (r, _) = ask(
            &shared,
            Request::Idle {
                age: Some(3600),
                exact: false,
            },
        );
        assert!(
            r.ok && r.data["marked"] == 0,
            "nothing is an hour old: {r:?}"
        );
        let (r, _) = ask(
            &shared,
            Request::Idle {
                age: None,
                exact: false,
            },
        );
        assert!(r.ok && r.data["marked"] == 4, "{r:?}");
        let (r, _) = ask(&shared, Request::Stats);
        assert_eq!(r.data["stats"]["idle_pages"], 4);
        // Exact: nothing is an hour old, so every mark is cleared; then
        // every page is 0 s old or more: all marked again.
        let exact = |age| Request::Idle { age, exact: true };
        let (r, _) = ask(&shared, exact(Some(3600)));
        assert!(
            r.ok && r.data["marked"] == 0 && r.data["cleared"] == 4,
            "{r:?}"
        );
        let (r, _) = ask(&shared, exact(Some(0)));
        assert!(
            r.ok && r.data["marked"] == 4 && r.data["cleared"] == 0,
            "{r:?}"
        );
        let (r, _) = ask(&shared, exact(None));
        assert!(!r.ok && r.error.unwrap_or_default().contains("exact needs an age"));
        let recompress = |algo: &str, kind: &str| Request::Recompress {
            algo: algo.into(),
            priority: None,
            kind: kind.into(),
            threshold: 0,
            max_pages: 0,
            pages: vec![],
        };
        let priority = |n| Request::Recompress {
            algo: String::new(),
            priority: Some(n),
            kind: "all".into(),
            threshold: 0,
            max_pages: 0,
            pages: vec![],
        };
        for bad in [
            recompress("zstd:99", "idle"),
            recompress("zstd:9", "cold"),
            // No list yet: neither the whole nor an entry of it.
            recompress("", "idle"),
            priority(1),
        ] {
            let (r, _) = ask(&shared, bad);
            assert!(!r.ok && r.error.is_some(), "{r:?}");
        }
        // Page ranges: only their pages; one past the end is refused.
        let ranges = |pages: &[&str]| Request::Recompress {
            algo: "zstd:19".into(),
            priority: None,
            kind: "idle".into(),
            threshold: 0,
            max_pages: 0,
            pages: pages.iter().map(|p| p.to_string()).collect(),
        };
        let (r, _) = ask(&shared, ranges(&["2-99999999"]));
        let e = r.error.unwrap_or_default();
        assert!(
            e.contains("page range 2-99999999 is past the device's end"),
            "{e}"
        );
        let (r, _) = ask(&shared, ranges(&["1-2"]));
        assert!(r.ok, "{r:?}");
        assert_eq!(r.data["tried"], 2);
        let kept = r.data["recompressed"].as_u64().unwrap();
        // The whole device: what the ranges' recompression did not keep
        // (a page a secondary holds is not tried by it again).
        let (r, _) = ask(&shared, recompress("zstd:19", "idle"));
        assert!(r.ok, "{r:?}");
        assert_eq!(r.data["tried"], 4 - kept);
        // The store's list is now zstd:19: entry 1 is it, there is no 2.
        let (r, _) = ask(&shared, priority(2));
        assert!(
            !r.ok && r.error.as_deref().unwrap_or("").contains("priority 2"),
            "{r:?}"
        );
        let (r, _) = ask(&shared, priority(1));
        assert!(r.ok, "{r:?}");
        let (r, _) = ask(&shared, Request::Stats);
        let s = &r.data["stats"];
        assert_eq!(s["recompress_algorithm"], "zstd:19");
        assert_eq!(
            s["recompressed_pages"].as_u64().unwrap() > 0,
            s["recompress_saved_bytes"].as_u64().unwrap() > 0
        );
        let mut back = vec![0u8; 4 * PAGE_SIZE];
        ctx.read(0, &mut back).unwrap();
        assert!(back == text);
    }

    /// A device of one queue (no threads) with a backing file of 64
    /// blocks in `dir`, and 8 pages of text written at its start.
    fn with_backing(dir: &Path) -> (DeviceConfig, PathBuf, Arc<zblk::Store>, Queues, Vec<u8>) {
        let bd = dir.join("backing");
        std::fs::File::create(&bd)
            .unwrap()
            .set_len(64 * PAGE_SIZE as u64)
            .unwrap();
        let mut dc = cfg(1);
        dc.backing_dev = Some(bd.clone());
        let store = zblk::Store::new(dc.store_config()).unwrap();
        let shared = Queues::with_store(&dc, store.clone()).unwrap();
        fake::no_threads(&shared);
        let text: Vec<u8> = b"cold pages, written back; "
            .iter()
            .copied()
            .cycle()
            .take(8 * PAGE_SIZE)
            .collect();
        store.new_ctx().write(0, &text).unwrap();
        (dc, bd, store, shared, text)
    }

    #[test]
    fn writeback_and_its_limit_through_the_control_loop() {
        let dir = tempfile::tempdir().unwrap();
        let (dc, bd, store, shared, text) = with_backing(dir.path());
        let mut ctx = store.new_ctx();
        let wb = |kind: &str, limit| Request::Writeback {
            kind: Some(kind.into()),
            pages: vec![],
            limit,
        };
        let (r, _) = ask(&shared, wb("cold", 0));
        assert!(
            !r.ok
                && r.error
                    .as_deref()
                    .unwrap()
                    .contains("unknown writeback type")
        );
        let (r, _) = ask(&shared, wb("idle", 0));
        assert!(r.ok && r.data["written"] == 0, "nothing idle yet: {r:?}");
        ask(
            &shared,
            Request::Idle {
                age: None,
                exact: false,
            },
        );
        let (r, _) = ask(&shared, Request::SetWritebackLimit { pages: 3 });
        assert!(r.ok);
        let (r, _) = ask(&shared, wb("idle", 0));
        assert!(r.ok, "{r:?}");
        assert_eq!(
            (r.data["written"].as_u64(), r.data["limited"].as_bool()),
            (Some(3), Some(true))
        );
        ask(&shared, Request::SetWritebackLimit { pages: 0 });
        let (r, _) = ask(&shared, wb("idle", 2));
        assert_eq!(r.data["written"], 2, "{r:?}");
        let with_bd = DeviceInfo {
            config: dc.clone(),
            ..info()
        };
        let (r, _) = answer(&shared, &off(), &with_bd, Request::Stats);
        let s = &r.data["stats"];
        assert_eq!(s["bd_count"], 5);
        assert_eq!(s["bd_writes"], 5);
        assert_eq!(s["backing_dev"], bd.display().to_string());
        assert_eq!(s["writeback_limit_enable"], false);
        assert!(s["latency"]["writeback"]["count"].as_u64().unwrap() >= 5);
        assert_eq!(r.data["device"]["backing_dev"], bd.display().to_string());
        let mut back = vec![0u8; 8 * PAGE_SIZE];
        ctx.read(0, &mut back).unwrap();
        assert!(back == text);
        assert_eq!(store.stats().counters.bd_reads, 5);

        // A device without a backing device says so in one line.
        let plain = Queues::new(&cfg(1)).unwrap();
        fake::no_threads(&plain);
        let (r, _) = ask(&plain, wb("huge", 0));
        let e = r.error.unwrap();
        assert!(e.contains("no backing device") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn backing_compaction_through_the_control_loop() {
        let dir = tempfile::tempdir().unwrap();
        let (_, _, store, shared, text) = with_backing(dir.path());
        // Two writebacks, two blocks, each a few small objects.
        for pages in ["0-3", "4-7"] {
            let wb = Request::Writeback {
                kind: None,
                pages: vec![pages.into()],
                limit: 0,
            };
            let (r, _) = ask(&shared, wb);
            assert!(r.ok && r.data["written"] == 4, "{r:?}");
        }
        let (r, _) = ask(&shared, Request::CompactBacking { max_blocks: 0 });
        assert!(r.ok, "{r:?}");
        let d = &r.data;
        assert_eq!(d["bd_used_bytes_before"], 2 * PAGE_SIZE as u64, "{d}");
        assert_eq!(d["bd_used_bytes"], PAGE_SIZE as u64, "{d}");
        assert_eq!(
            (d["objects_moved"].as_u64(), d["blocks_freed"].as_u64()),
            (Some(8), Some(1))
        );
        assert_eq!(d["bd_bytes"], store.stats().counters.bd_bytes);
        let mut back = vec![0u8; 8 * PAGE_SIZE];
        store.new_ctx().read(0, &mut back).unwrap();
        assert!(back == text);
        let plain = Queues::new(&cfg(1)).unwrap();
        fake::no_threads(&plain);
        let (r, _) = ask(&plain, Request::CompactBacking { max_blocks: 8 });
        let e = r.error.unwrap();
        assert!(e.contains("no backing device") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn writeback_by_page_ranges_and_dump_through_the_control_loop() {
        let dir = tempfile::tempdir().unwrap();
        let (_, _, store, shared, text) = with_backing(dir.path());
        let wb = |kind: Option<&str>, pages: &[&str]| Request::Writeback {
            kind: kind.map(Into::into),
            pages: pages.iter().map(|p| p.to_string()).collect(),
            limit: 0,
        };
        for (req, want) in [
            (wb(Some("idle"), &["1"]), "do not combine"),
            (wb(None, &[]), "give a type or page ranges"),
            (wb(None, &["5-2"]), "first page is past its last"),
            (
                wb(None, &["250-256"]),
                "past the device's end (its pages are 0-255)",
            ),
        ] {
            let (r, _) = ask(&shared, req);
            let e = r.error.unwrap_or_default();
            assert!(e.contains(want) && !e.contains('\n'), "{want}: {e}");
        }
        let (r, _) = ask(&shared, wb(None, &["1-2", "6", "2"]));
        assert!(r.ok, "{r:?}");
        assert_eq!(
            (&r.data["selected"], &r.data["written"]),
            (&3.into(), &3.into())
        );

        let (r, _) = ask(&shared, Request::Dump { start: 0, count: 0 });
        assert!(r.ok, "{r:?}");
        assert!(r.data["next"].is_null(), "256 pages fit one chunk");
        let slots: Vec<zblk::SlotState> = serde_json::from_value(r.data["slots"].clone()).unwrap();
        let kinds: Vec<_> = slots.iter().map(|s| (s.index, s.kind.name())).collect();
        let want: Vec<_> = (0..8u64)
            .map(|i| {
                let backed = matches!(i, 1 | 2 | 6);
                (i, if backed { "written_back" } else { "compressed" })
            })
            .collect();
        assert_eq!(kinds, want);
        let (r, _) = ask(
            &shared,
            Request::Dump {
                start: 7,
                count: 100,
            },
        );
        assert_eq!(
            (r.data["slots"].as_array().unwrap().len(), &r.data["next"]),
            (1, &107.into())
        );
        let (r, _) = ask(
            &shared,
            Request::Dump {
                start: 257,
                count: 1,
            },
        );
        assert!(r
            .error
            .unwrap_or_default()
            .contains("past the device's end"));
        // Slots by page: the stored ones, in the order asked.
        let (r, _) = ask(
            &shared,
            Request::Slots {
                pages: vec![6, 200, 0, 9999],
            },
        );
        let slots: Vec<zblk::SlotState> = serde_json::from_value(r.data["slots"].clone()).unwrap();
        let got: Vec<_> = slots.iter().map(|s| (s.index, s.kind.name())).collect();
        assert_eq!(got, [(6, "written_back"), (0, "compressed")]);
        let (r, _) = ask(
            &shared,
            Request::Slots {
                pages: vec![0; SLOTS_BATCH + 1],
            },
        );
        let e = r.error.unwrap_or_default();
        assert!(e.contains("at most 4096 a request"), "{e}");
        // A sample: whole stored pages, at most what the device holds.
        let (r, _) = ask(&shared, Request::Sample { bytes: 1 << 20 });
        let sample: Vec<u8> = serde_json::from_value(r.data["sample"].clone()).unwrap();
        assert_eq!(sample.len(), 8 * PAGE_SIZE, "the 8 stored pages");
        assert!(sample == text);
        let mut back = vec![0u8; 8 * PAGE_SIZE];
        store.new_ctx().read(0, &mut back).unwrap();
        assert!(back == text);
    }

    /// Polls `f` every few milliseconds for up to ten seconds.
    fn eventually(what: &str, mut f: impl FnMut() -> bool) {
        let t0 = std::time::Instant::now();
        while !f() {
            assert!(t0.elapsed() < Duration::from_secs(10), "never: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn the_policy_refuses_what_the_device_cannot_do() {
        let plain = Queues::new(&cfg(1)).unwrap();
        fake::no_threads(&plain);
        let p = off();
        let set = |r: Option<u64>, w: Option<u64>, a: Option<&str>| {
            let req = Request::SetPolicy {
                recompress_idle_after: r,
                writeback_idle_after: w,
                recompress_algo: a.map(Into::into),
            };
            answer(&plain, &p, &info(), req).0
        };
        for (r, want) in [
            (set(None, Some(60), None), "needs a backing device"),
            (set(Some(60), None, None), "needs --recompress-algo"),
            (set(Some(60), None, Some("lz4")), "must not name"),
            (set(Some(60), None, Some("lzo")), "unknown algorithm"),
            (
                set(Some(1 << 30), None, Some("zstd")),
                "past what slots keep",
            ),
        ] {
            let e = r.error.unwrap_or_default();
            assert!(e.contains(want) && !e.contains('\n'), "{want}: {e}");
        }
        assert_eq!(p.settings(), Default::default(), "refused: unchanged");
        let r = set(Some(60), None, Some("zstd:9"));
        assert!(r.ok, "{r:?}");
        assert_eq!(
            (
                r.data["recompress_idle_after"].as_u64(),
                r.data["recompress_algo"].as_str()
            ),
            (Some(60), Some("zstd:9"))
        );
        let r = set(Some(0), None, None);
        assert_eq!(r.data["recompress_idle_after"], 0, "0 turns it off");
        let (r, _) = answer(&plain, &p, &info(), Request::Stats);
        assert_eq!(r.data["policy"]["recompress_algo"], "zstd:9");
        assert_eq!(r.data["policy"]["rounds"], 0);
    }

    #[test]
    fn the_policy_recompresses_and_writes_back_idle_pages_on_its_own() {
        use crate::policy::{self, Timing};
        let (_dir, bd) = crate::testing::backing_file(64 * PAGE_SIZE as u64);
        let mut dc = cfg(1);
        dc.backing_dev = Some(bd);
        let store = zblk::Store::new(dc.store_config()).unwrap();
        let shared = Arc::new(Queues::with_store(&dc, store.clone()).unwrap());
        fake::no_threads(&shared);
        let mut ctx = store.new_ctx();
        let text: Vec<u8> = b"idle pages the policy finds by itself; "
            .iter()
            .copied()
            .cycle()
            .take(10 * PAGE_SIZE)
            .collect();
        ctx.write(0, &text[..8 * PAGE_SIZE]).unwrap();
        store.debug_advance_clock(1000);
        // Two young pages, which no round may touch.
        ctx.write(8 * PAGE_SIZE as u64, &text[8 * PAGE_SIZE..])
            .unwrap();
        // Ticks long enough that a pump thread descheduled on a loaded
        // machine still counts well over 1000 requests/s in every one.
        let fast = Timing {
            tick: Duration::from_millis(100),
            round_every: Duration::from_millis(100),
            busy_rps: 1000,
            rate: 100_000,
            max_pages: 1000,
        };
        let p = Arc::new(Policy::new(Default::default(), fast));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = policy::spawn(shared.clone(), p.clone(), stop.clone()).unwrap();

        // Swap traffic well over 1000 requests per second: rounds wait.
        let busy = Arc::new(AtomicBool::new(true));
        let pump = {
            let (q, busy) = (shared.clone(), busy.clone());
            std::thread::spawn(move || {
                while busy.load(Ordering::SeqCst) {
                    fake::serve_requests(&q, 0, 100);
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        };
        let set = |r: Option<u64>, w: Option<u64>| Request::SetPolicy {
            recompress_idle_after: r,
            writeback_idle_after: w,
            recompress_algo: Some("zstd:9".into()),
        };
        let (r, _) = answer(&shared, &p, &info(), set(Some(500), None));
        assert!(r.ok, "{r:?}");
        eventually("rounds skipped while busy", || {
            p.report(&store).rounds_skipped_busy >= 4
        });
        let rep = p.report(&store);
        assert_eq!((rep.rounds, rep.recompressed_pages), (0, 0), "{rep:?}");
        assert_eq!(store.stats().counters.recompressed_pages, 0);

        // Quiet again: the idle pages are recompressed, the young ones not.
        busy.store(false, Ordering::SeqCst);
        pump.join().unwrap();
        eventually("idle pages recompressed", || {
            p.report(&store).recompressed_pages >= 8
        });
        assert_eq!(store.stats().counters.recompressed_pages, 8);
        assert!(p.report(&store).rounds > 0);

        // Writeback too, and without a single manual command.
        let (r, _) = answer(&shared, &p, &info(), set(None, Some(500)));
        assert!(r.ok && r.data["writeback_idle_after"] == 500, "{r:?}");
        eventually("idle pages written back", || {
            p.report(&store).written_back_pages >= 8
        });
        let (r, _) = answer(&shared, &p, &info(), Request::Stats);
        let (s, pol) = (&r.data["stats"], &r.data["policy"]);
        assert_eq!(s["bd_count"], 8, "the two young pages stay in RAM");
        assert_eq!(pol["written_back_pages"], 8);
        assert_eq!(pol["recompressed_pages"], 8);
        assert_eq!(pol["errors"], 0);
        stop.store(true, Ordering::SeqCst);
        thread.join().unwrap();
        let mut back = vec![0u8; 10 * PAGE_SIZE];
        ctx.read(0, &mut back).unwrap();
        assert!(back == text);
    }

    #[test]
    fn info_keeps_its_json_field_names() {
        let v = serde_json::to_value(info()).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        for k in [
            "id",
            "name",
            "path",
            "size",
            "algorithm",
            "group_pages",
            "mode",
            "mem_limit",
            "queues",
            "queue_cpus",
            "io_threads",
            "depth",
            "io_buf_bytes",
            "no_recovery",
            "huge_pages",
            "pid",
            "recovery",
            "features",
            "transport",
            "transport_in_use",
        ] {
            assert!(keys.contains(&k), "{k} missing from {keys:?}");
        }
        assert_eq!(keys.len(), 20, "{keys:?}");
        assert_eq!(v["queue_cpus"], "queue");
        assert_eq!(v["transport"], "classic");
        assert_eq!(v["transport_in_use"], "batch");
        assert_eq!(v["recovery"], "reissue");
        assert_eq!(v["algorithm"], "lz4");
        assert_eq!(v["mode"], "per-page");
        assert_eq!(v["io_buf_bytes"], 1 << 20);
    }

    /// Sends `request` as a client would and returns the one reply line.
    fn exchange(shared: &Queues, request: &[u8]) -> Response {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(request).unwrap();
        assert_eq!(serve_client(shared, &off(), &info(), b), Next::Serve);
        let mut line = String::new();
        BufReader::new(&a).read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    }

    /// Set (to a socket path) in the non-root child of
    /// [`a_non_root_peer_is_refused_every_command`].
    const PEER_CHILD: &str = "ZBLK_PEER_CHILD";

    /// Every request a client can send, once each.
    fn every_request() -> Vec<Request> {
        vec![
            Request::Info,
            Request::Stats,
            Request::Compact,
            Request::CompactBacking { max_blocks: 0 },
            Request::Idle {
                age: None,
                exact: false,
            },
            Request::Recompress {
                algo: "zstd:9".into(),
                priority: None,
                kind: "all".into(),
                threshold: 0,
                max_pages: 0,
                pages: vec![],
            },
            Request::SetMemLimit { bytes: 4096 },
            Request::Shutdown { force: true },
            Request::Handover,
        ]
    }

    /// The child's half, run as uid 65534: sends every request on its own
    /// connection and prints each reply line.
    #[test]
    fn non_root_peer_child() {
        let Ok(path) = std::env::var(PEER_CHILD) else {
            return;
        };
        for req in every_request() {
            let mut s = UnixStream::connect(&path).unwrap();
            let mut line = serde_json::to_string(&req).unwrap();
            line.push('\n');
            s.write_all(line.as_bytes()).unwrap();
            let mut reply = String::new();
            BufReader::new(&s).read_line(&mut reply).unwrap();
            println!("REPLY {}", reply.trim_end());
        }
    }

    /// A process of uid 65534 that reaches the socket (its mode opened on
    /// purpose, so that only the peer check stands in the way) gets one
    /// refusal line for every command, and nothing changes.
    #[test]
    fn a_non_root_peer_is_refused_every_command() {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!(
                "skipped: starting a uid-65534 client needs root (the tests run as root in CI)"
            );
            return;
        }
        let store = zblk::Store::new(cfg(1).store_config()).unwrap();
        let shared = Queues::with_store(&cfg(1), store.clone()).unwrap();
        fake::no_threads(&shared);
        store.new_ctx().write(0, &[7u8; PAGE_SIZE]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("0.sock");
        let listener = UnixListener::bind(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "control::server::tests::non_root_peer_child",
                "--nocapture",
            ])
            .env(PEER_CHILD, &path)
            .uid(65534)
            .gid(65534)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        listener.set_nonblocking(true).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut served = 0;
        while served < every_request().len() {
            assert!(std::time::Instant::now() < deadline, "the child stalled");
            match listener.accept() {
                Ok((s, _)) => {
                    assert_eq!(serve_client(&shared, &off(), &info(), s), Next::Serve);
                    served += 1;
                }
                Err(_) if child.try_wait().unwrap().is_some() => break,
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let replies: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("REPLY "))
            .collect();
        assert_eq!(replies.len(), every_request().len(), "{text}");
        for r in replies {
            let r: Response = serde_json::from_str(r).unwrap();
            assert!(!r.ok && r.data.is_null(), "{r:?}");
            assert_eq!(
                r.error.unwrap(),
                "permission denied: zblk's control socket answers root only (you are uid 65534)"
            );
        }
        // Nothing was done for it: no limit, no idle mark, the page kept.
        let st = serde_json::to_value(shared.store().stats()).unwrap();
        assert_eq!(
            (&st["mem_limit"], &st["idle_pages"], &st["stored_pages"]),
            (&0.into(), &0.into(), &1.into())
        );
        // And root, on the same socket, is answered.
        let r = exchange(&shared, b"{\"cmd\":\"info\"}\n");
        assert!(r.ok, "{r:?}");
    }

    #[test]
    fn a_client_gets_one_reply_line() {
        let shared = Queues::new(&cfg(1)).unwrap();
        fake::no_threads(&shared);
        let r = exchange(&shared, b"{\"cmd\":\"stats\"}\n");
        assert!(r.ok);
        assert_eq!(r.data["stats"]["disksize"], 256 * PAGE_SIZE as u64);

        let r = exchange(&shared, b"not json\n");
        assert!(!r.ok && r.error.unwrap().contains("bad request"));
    }
}
