//! The control socket: one JSON request per connection, one JSON reply.
//!
//! Each daemon listens on `/run/zblk/<id>.sock` (mode 0600 in a 0700
//! directory: root only; and every connection's peer is checked too, see
//! [`peer`]). A client writes one line such as
//! `{"cmd":"stats"}` and reads one line back:
//! `{"ok":true,"data":{...}}` or `{"ok":false,"error":"..."}`.
//!
//! This module is the protocol; [`client`] asks a daemon, [`server`]
//! answers for one.

pub mod client;
pub mod peer;
pub mod server;

pub use client::{request, ClientError};

use crate::config::DeviceConfig;
use crate::features::{Features, Recovery};
use crate::transport::Transport;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;

/// What a client asks of a daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// The device's description ([`DeviceInfo`]).
    Info,
    /// The device and its engine statistics, after every queue has freed
    /// its batched handles: `{"device": DeviceInfo, "stats": StoreStats,
    /// "policy": ..}` (the idle policy's settings and counters).
    Stats,
    /// Runs compaction: `{"pages_compacted": N}`.
    Compact,
    /// Compacts the backing store (the written-back per-page objects of
    /// its sparse blocks, moved into fresh ones): a
    /// `zblk::BackingCompactReport` with `bd_bytes`, and `bd_used_bytes`
    /// before (`bd_used_bytes_before`) and after.
    CompactBacking {
        /// Look at most at this many blocks (0: every sparse block).
        #[serde(default)]
        max_blocks: u64,
    },
    /// Marks pages idle (zram's `idle` file): every stored page, or those
    /// not accessed for `age` seconds: `{"marked": N}`; with `exact`,
    /// exactly those, the marks of younger pages cleared (what the idle
    /// policy does each round): `{"marked": N, "cleared": N}`.
    Idle {
        /// Only pages not accessed for this many seconds (none: all).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        age: Option<u64>,
        /// Clear the marks of the pages younger than `age` (which it
        /// needs).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        exact: bool,
    },
    /// Recompresses pages with a secondary algorithm (zram's
    /// `recompress`): `{"tried": N, "recompressed": N, "saved_bytes": N}`.
    /// `kind` and `pages` combine: the pages of that type in those ranges.
    Recompress {
        /// One secondary algorithm (`zstd:9`, `deflate:9`, ...); empty:
        /// the device's list (`--recompress-algos`), tried in order.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        algo: String,
        /// The entry of the device's list to use alone (1-based).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        priority: Option<u8>,
        /// Which pages: `all`, `idle`, `huge` or `huge_idle`.
        #[serde(default = "all")]
        kind: String,
        /// Only pages whose object is at least this many bytes (0: any).
        #[serde(default)]
        threshold: u64,
        /// Try at most this many pages (0: no limit).
        #[serde(default)]
        max_pages: u64,
        /// Only the pages of these ranges (none: the whole device): `N` or
        /// `LOW-HIGH`, as `writeback`'s `pages`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pages: Vec<String>,
    },
    /// Writes pages back to the device's backing device (zram's
    /// `writeback`): a `zblk::WritebackReport` and `pages_compacted`.
    /// Exactly one of `kind` and `pages` says which pages.
    Writeback {
        /// Which pages: `idle`, `huge`, `incompressible` or `huge_idle`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<String>,
        /// Or every stored page of these ranges: `N` or `LOW-HIGH`
        /// (inclusive; zram's `page_index=` and `page_indexes=`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pages: Vec<String>,
        /// Write back at most this many pages (0: no limit but the
        /// device's writeback limit).
        #[serde(default)]
        limit: u64,
    },
    /// What the slots from page `start` on hold (zram's `block_state`):
    /// `{"slots": [zblk::SlotState, ..], "next": N}` for the stored pages
    /// of at most `count` slots (and no more than [`DUMP_CHUNK`]); `next`
    /// is where to ask from next, null at the device's end. A client walks
    /// the device chunk by chunk, so the daemon never holds more than one
    /// slot nor builds more than one chunk.
    Dump {
        /// The first page.
        #[serde(default)]
        start: u64,
        /// Slots to look at (0 or more than [`DUMP_CHUNK`]: [`DUMP_CHUNK`]).
        #[serde(default)]
        count: u64,
    },
    /// What the slots of the pages `pages` hold, for the attribution of
    /// swapped pages to processes (`zblk stat --by`): `{"slots":
    /// [zblk::SlotState, ..]}` for the stored ones, in the order asked;
    /// empty slots and pages past the device's end are left out. At most
    /// [`SLOTS_BATCH`] pages a request (more is refused), one slot lock at
    /// a time, as `dump`.
    Slots {
        /// Device page indexes (swap offsets), in any order.
        pages: Vec<u64>,
    },
    /// Stored pages sampled evenly across the device, decoded, for a
    /// dictionary (`zblk dict train`): `{"sample": [bytes..]}`, whole
    /// pages, at most `bytes` (and no more than `zblk::MAX_DICT_BYTES`).
    /// Reading them is not an access.
    Sample {
        /// Bytes wanted.
        bytes: u64,
    },
    /// Sets the writeback limit in pages (zram's `writeback_limit`;
    /// 0: off).
    SetWritebackLimit {
        /// Pages writeback may write from now on.
        pages: u64,
    },
    /// Changes the idle policy (`crate::policy`); a field left out keeps
    /// its value: `{"recompress_idle_after": N, ...}` (its report).
    SetPolicy {
        /// Recompress pages not accessed for this many seconds (0: off).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        recompress_idle_after: Option<u64>,
        /// Write back pages not accessed for this many seconds (0: off).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        writeback_idle_after: Option<u64>,
        /// The secondary algorithm to recompress with.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        recompress_algo: Option<String>,
    },
    /// Sets the memory limit in bytes (0: none).
    SetMemLimit {
        /// The new limit.
        bytes: u64,
    },
    /// Stops and deletes the device. Refused while it is active swap
    /// unless `force`.
    Shutdown {
        /// Stop even if the device is active swap.
        #[serde(default)]
        force: bool,
    },
    /// Stops serving without deleting the device, for a new daemon to take
    /// it over (`zblk restart`): the daemon replies, then exits with
    /// [`crate::keeper::EXIT_HANDOVER`]. Refused unless recovery is on.
    Handover,
}

/// Most slots one `dump` reply covers: a reply of that many stored pages
/// stays well under [`MAX_LINE`] (about 120 bytes of JSON each).
pub const DUMP_CHUNK: u64 = 4096;

/// Most pages one `slots` request asks for: its reply stays well under
/// [`MAX_LINE`] as a `dump` chunk's does, and so does the request (at
/// most 21 bytes a page).
pub const SLOTS_BATCH: usize = DUMP_CHUNK as usize;

/// The default recompression type.
fn all() -> String {
    "all".into()
}

/// A daemon's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// Whether the request succeeded.
    pub ok: bool,
    /// Why not, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The result, when it did.
    #[serde(default)]
    pub data: serde_json::Value,
}

impl Response {
    /// A success carrying `data`.
    pub fn ok(data: serde_json::Value) -> Self {
        Response {
            ok: true,
            error: None,
            data,
        }
    }

    /// A failure saying why.
    pub fn err(msg: impl Into<String>) -> Self {
        Response {
            ok: false,
            error: Some(msg.into()),
            data: serde_json::Value::Null,
        }
    }
}

/// What a device is, as `zblk add` prints it and `zblk list` shows it:
/// its configuration with every automatic choice made, and what only the
/// running device knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// Block device name, `ublkbN`.
    pub name: String,
    /// Block device path.
    pub path: String,
    /// The configuration it runs with ([`DeviceConfig::resolved`]): the
    /// JSON fields `id`, `size`, `algorithm`, `group_pages`, `mode`,
    /// `mem_limit`, `queues`, `io_threads`, `depth` and `io_buf_bytes`.
    #[serde(flatten)]
    pub config: DeviceConfig,
    /// Daemon process id.
    pub pid: u32,
    /// How the device survives its daemon: `reissue`, `plain` or `off`.
    #[serde(default)]
    pub recovery: Recovery,
    /// The feature bits the ublk driver reports (`USER_RECOVERY`, ...).
    #[serde(default)]
    pub features: Vec<String>,
    /// How requests reach the queues (`crate::transport`).
    #[serde(default, rename = "transport_in_use")]
    pub transport: Transport,
}

impl DeviceInfo {
    /// Device `id` at `path`, served by this process with `config` (whose
    /// automatic choices are made here, with the driver's I/O buffer size).
    pub fn new(id: u32, path: String, config: &DeviceConfig, io_buf_bytes: u32) -> Self {
        DeviceInfo {
            name: format!("ublkb{id}"),
            path,
            config: config.resolved(id, io_buf_bytes),
            pid: std::process::id(),
            recovery: Recovery::Off,
            features: Vec::new(),
            transport: Transport::Classic,
        }
    }

    /// The same, with the transport the driver gave the device.
    pub fn with_transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    /// The same, with the recovery it got on a driver with `features`.
    pub fn with_recovery(mut self, recovery: Recovery, features: Features) -> Self {
        self.recovery = recovery;
        self.features = features.names();
        self
    }

    /// ublk device id (N of `/dev/ublkbN`).
    pub fn id(&self) -> u32 {
        self.config.id.unwrap_or_default()
    }
}

/// Why a request line could not be read.
#[derive(Debug)]
pub enum RequestError {
    /// Reading the line failed.
    Read(std::io::Error),
    /// The line is not a request.
    Parse(serde_json::Error),
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Read(e) => write!(f, "reading request: {e}"),
            RequestError::Parse(e) => write!(f, "bad request: {e}"),
        }
    }
}

impl std::error::Error for RequestError {}

/// Longest request or reply line accepted.
pub const MAX_LINE: u64 = 1 << 20;

/// Reads one request line from a client (server side).
pub fn read_request(s: &mut UnixStream) -> Result<Request, RequestError> {
    let mut line = String::new();
    BufReader::new((&*s).take(MAX_LINE))
        .read_line(&mut line)
        .map_err(RequestError::Read)?;
    serde_json::from_str(&line).map_err(RequestError::Parse)
}

/// Writes one reply line (server side).
pub fn write_response(s: &mut UnixStream, resp: &Response) -> std::io::Result<()> {
    let mut line = serde_json::to_string(resp).map_err(std::io::Error::other)?;
    line.push('\n');
    s.write_all(line.as_bytes())
}

/// Answers a client that is not root with one refusal line, before
/// reading anything from it; true when it was refused (server side, for
/// the daemon's and the keeper's sockets alike).
pub fn refuse_non_root(s: &mut UnixStream) -> bool {
    let Some(why) = peer::check(s) else {
        return false;
    };
    log::warn!("control client refused: {why}");
    // Its request is read (bounded, and not acted on) before the reply:
    // closing on an unread request would make the client's write fail
    // with EPIPE instead of it reading why.
    let _ = read_request(s);
    if let Err(e) = write_response(s, &Response::err(why)) {
        log::warn!("control client: {e}");
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_a_stable_wire_form() {
        let cases = [
            (Request::Info, r#"{"cmd":"info"}"#),
            (Request::Stats, r#"{"cmd":"stats"}"#),
            (Request::Compact, r#"{"cmd":"compact"}"#),
            (
                Request::CompactBacking { max_blocks: 64 },
                r#"{"cmd":"compact_backing","max_blocks":64}"#,
            ),
            (
                Request::SetMemLimit { bytes: 4096 },
                r#"{"cmd":"set_mem_limit","bytes":4096}"#,
            ),
            (
                Request::Shutdown { force: true },
                r#"{"cmd":"shutdown","force":true}"#,
            ),
            (Request::Handover, r#"{"cmd":"handover"}"#),
            (
                Request::SetPolicy {
                    recompress_idle_after: None,
                    writeback_idle_after: Some(60),
                    recompress_algo: None,
                },
                r#"{"cmd":"set_policy","writeback_idle_after":60}"#,
            ),
            (
                Request::Idle {
                    age: None,
                    exact: false,
                },
                r#"{"cmd":"idle"}"#,
            ),
            (
                Request::Idle {
                    age: Some(60),
                    exact: false,
                },
                r#"{"cmd":"idle","age":60}"#,
            ),
            (
                Request::Idle {
                    age: Some(60),
                    exact: true,
                },
                r#"{"cmd":"idle","age":60,"exact":true}"#,
            ),
            (
                Request::Recompress {
                    algo: "zstd:9".into(),
                    priority: None,
                    kind: "idle".into(),
                    threshold: 1000,
                    max_pages: 5,
                    pages: vec![],
                },
                r#"{"cmd":"recompress","algo":"zstd:9","kind":"idle","threshold":1000,"max_pages":5}"#,
            ),
            (
                Request::Recompress {
                    algo: String::new(),
                    priority: None,
                    kind: "all".into(),
                    threshold: 0,
                    max_pages: 0,
                    pages: vec!["3".into(), "10-20".into()],
                },
                r#"{"cmd":"recompress","kind":"all","threshold":0,"max_pages":0,"pages":["3","10-20"]}"#,
            ),
            (
                Request::Writeback {
                    kind: Some("idle".into()),
                    pages: vec![],
                    limit: 0,
                },
                r#"{"cmd":"writeback","kind":"idle","limit":0}"#,
            ),
            (
                Request::Writeback {
                    kind: None,
                    pages: vec!["3".into(), "10-20".into()],
                    limit: 5,
                },
                r#"{"cmd":"writeback","pages":["3","10-20"],"limit":5}"#,
            ),
            (
                Request::Dump {
                    start: 4096,
                    count: 100,
                },
                r#"{"cmd":"dump","start":4096,"count":100}"#,
            ),
            (
                Request::Slots {
                    pages: vec![7, 0, 4096],
                },
                r#"{"cmd":"slots","pages":[7,0,4096]}"#,
            ),
            (
                Request::Sample { bytes: 65536 },
                r#"{"cmd":"sample","bytes":65536}"#,
            ),
        ];
        for (req, wire) in cases {
            assert_eq!(serde_json::to_string(&req).unwrap(), wire);
            assert_eq!(serde_json::from_str::<Request>(wire).unwrap(), req);
        }
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"shutdown"}"#).unwrap(),
            Request::Shutdown { force: false }
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"recompress","algo":"deflate"}"#).unwrap(),
            Request::Recompress {
                algo: "deflate".into(),
                priority: None,
                kind: "all".into(),
                threshold: 0,
                max_pages: 0,
                pages: vec![],
            }
        );
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"format_disk"}"#).is_err());
        assert!(
            serde_json::from_str::<Request>(r#"{"cmd":"slots"}"#).is_err(),
            "slots needs its pages"
        );
        // The largest batch, with the largest page numbers, fits a line.
        let most = Request::Slots {
            pages: vec![u64::MAX; SLOTS_BATCH],
        };
        let line = serde_json::to_string(&most).unwrap();
        assert!((line.len() as u64) < MAX_LINE, "{}", line.len());
    }

    #[test]
    fn request_and_reply_over_a_socket_pair() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let req = read_request(&mut b).unwrap();
            assert_eq!(req, Request::Compact);
            write_response(
                &mut b,
                &Response::ok(serde_json::json!({"pages_compacted": 3})),
            )
            .unwrap();
        });
        a.write_all(b"{\"cmd\":\"compact\"}\n").unwrap();
        let mut reply = String::new();
        BufReader::new(&a).read_line(&mut reply).unwrap();
        let r: Response = serde_json::from_str(&reply).unwrap();
        assert!(r.ok);
        assert_eq!(r.data["pages_compacted"], 3);
        t.join().unwrap();
    }
}
