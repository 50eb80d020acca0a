//! The readiness line: one JSON line a daemon (or keeper) writes on stdout
//! once its device serves I/O or it failed to start, read by whoever
//! started it (`zblk add`, the keeper).

use crate::control::DeviceInfo;
use std::fmt::Display;

/// The readiness line for a start result.
pub fn line<E: Display + ?Sized>(r: Result<&DeviceInfo, &E>) -> String {
    match r {
        Ok(info) => serde_json::json!({ "ok": true, "device": info }).to_string(),
        Err(e) => serde_json::json!({ "ok": false, "error": e.to_string() }).to_string(),
    }
}

/// Reads a readiness line: the device, or why it did not start.
pub fn parse(line: &str) -> Result<DeviceInfo, String> {
    let v: serde_json::Value = serde_json::from_str(line)
        .map_err(|e| format!("bad readiness line from the daemon: {e}"))?;
    if v["ok"] != serde_json::Value::Bool(true) {
        return Err(v["error"].as_str().unwrap_or("unknown error").to_string());
    }
    serde_json::from_value(v["device"].clone())
        .map_err(|e| format!("bad device description from the daemon: {e}"))
}
