//! The client side of the control socket: one request, one reply.

use super::{Request, Response, MAX_LINE};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

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

/// Sends `req` to the daemon of device `id` and returns its data.
pub fn request(
    id: u32,
    req: &Request,
    timeout: Duration,
) -> Result<serde_json::Value, ClientError> {
    request_at(&crate::paths::socket_path(id), id, req, timeout)
}

/// Sends `req` (any request type) on the socket at `path`, which speaks
/// for device `id`, and returns the reply's data.
pub fn request_at<R: serde::Serialize>(
    path: &std::path::Path,
    id: u32,
    req: &R,
    timeout: Duration,
) -> Result<serde_json::Value, ClientError> {
    let mut s = UnixStream::connect(path).map_err(|e| match e.kind() {
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
    // A server that refused us may have replied and closed before
    // reading: the reply, if there is one, says more than EPIPE.
    if let Err(e) = s.write_all(line.as_bytes()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(io(e));
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_socket_is_no_device() {
        let r = request(4_000_000, &Request::Info, Duration::from_secs(1));
        assert!(matches!(r, Err(ClientError::NoDevice(4_000_000))), "{r:?}");
    }
}
