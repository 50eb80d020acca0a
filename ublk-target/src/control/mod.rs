//! The control socket: one JSON request per connection, one JSON reply.
//!
//! Each daemon listens on `/run/zblk/<id>.sock` (mode 0600 in a 0700
//! directory: root only). A client writes one line such as
//! `{"cmd":"stats"}` and reads one line back:
//! `{"ok":true,"data":{...}}` or `{"ok":false,"error":"..."}`.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// What a client asks of a daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// The device's description ([`DeviceInfo`]).
    Info,
    /// The device and its engine statistics, after every queue has freed
    /// its batched handles: `{"device": DeviceInfo, "stats": StoreStats}`.
    Stats,
    /// Runs compaction: `{"pages_compacted": N}`.
    Compact,
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

/// What a device is, as `zblk add` prints it and `zblk list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// ublk device id (N of `/dev/ublkbN`).
    pub id: u32,
    /// Block device name, `ublkbN`.
    pub name: String,
    /// Block device path.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Compression algorithm.
    pub algorithm: String,
    /// Pages per compression group.
    pub group_pages: usize,
    /// How groups are stored: `per-page` or `packed`.
    pub mode: String,
    /// Memory limit in bytes at creation (0: none).
    pub mem_limit: u64,
    /// Number of ublk queues (one thread and engine context each).
    pub queues: u16,
    /// Queue depth.
    pub depth: u16,
    /// Bytes of I/O buffer per tag (largest request).
    pub io_buf_bytes: u32,
    /// Daemon process id.
    pub pid: u32,
}

/// Why a request could not be answered.
#[derive(Debug)]
pub enum ClientError {
    /// No daemon serves that id.
    NoDevice(u32),
    /// The socket is root's.
    PermissionDenied,
    /// The exchange failed.
    Io(String),
    /// The daemon answered `ok: false`.
    Refused(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::NoDevice(id) => write!(
                f,
                "no such device: zblk {id} (no daemon listens on {})",
                crate::paths::socket_path(*id).display()
            ),
            ClientError::PermissionDenied => write!(
                f,
                "permission denied: zblk's control sockets are root's (run as root)"
            ),
            ClientError::Io(m) => write!(f, "{m}"),
            ClientError::Refused(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// Longest request or reply line accepted.
pub const MAX_LINE: u64 = 1 << 20;

/// Sends `req` to the daemon of device `id` and returns its data.
pub fn request(
    id: u32,
    req: &Request,
    timeout: Duration,
) -> Result<serde_json::Value, ClientError> {
    let path = crate::paths::socket_path(id);
    let mut s = UnixStream::connect(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            ClientError::NoDevice(id)
        }
        std::io::ErrorKind::PermissionDenied => ClientError::PermissionDenied,
        _ => ClientError::Io(format!("cannot connect to {}: {e}", path.display())),
    })?;
    let io = |e: std::io::Error| ClientError::Io(format!("device {id}: control socket: {e}"));
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    let mut line = serde_json::to_string(req).map_err(|e| ClientError::Io(e.to_string()))?;
    line.push('\n');
    s.write_all(line.as_bytes()).map_err(io)?;
    let mut reply = String::new();
    BufReader::new(s.take(MAX_LINE))
        .read_line(&mut reply)
        .map_err(io)?;
    let resp: Response = serde_json::from_str(&reply)
        .map_err(|e| ClientError::Io(format!("device {id}: bad reply from daemon: {e}")))?;
    if resp.ok {
        Ok(resp.data)
    } else {
        Err(ClientError::Refused(
            resp.error.unwrap_or_else(|| "refused".into()),
        ))
    }
}

/// Reads one request line from a client (server side).
pub fn read_request(s: &mut UnixStream) -> Result<Request, String> {
    let mut line = String::new();
    BufReader::new((&*s).take(MAX_LINE))
        .read_line(&mut line)
        .map_err(|e| format!("reading request: {e}"))?;
    serde_json::from_str(&line).map_err(|e| format!("bad request: {e}"))
}

/// Writes one reply line (server side).
pub fn write_response(s: &mut UnixStream, resp: &Response) -> std::io::Result<()> {
    let mut line = serde_json::to_string(resp).map_err(std::io::Error::other)?;
    line.push('\n');
    s.write_all(line.as_bytes())
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
                Request::SetMemLimit { bytes: 4096 },
                r#"{"cmd":"set_mem_limit","bytes":4096}"#,
            ),
            (
                Request::Shutdown { force: true },
                r#"{"cmd":"shutdown","force":true}"#,
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
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"format_disk"}"#).is_err());
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

    #[test]
    fn missing_socket_is_no_device() {
        let r = request(4_000_000, &Request::Info, Duration::from_secs(1));
        assert!(matches!(r, Err(ClientError::NoDevice(4_000_000))), "{r:?}");
    }
}
