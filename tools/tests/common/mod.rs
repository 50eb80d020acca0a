//! Stand-in daemons for the tests that run the real `zblk` binary over a
//! temporary run directory (its hidden `--run-dir`).

// Each test binary that includes this module uses only part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;

/// A stats reply of a 1 MB device with two queues that stored 3 pages,
/// one of them zero-filled.
pub fn sample_reply(id: u32) -> serde_json::Value {
    let store = zblk::Store::new(zblk::StoreConfig::new(1 << 20)).unwrap();
    let mut q0 = store.new_ctx();
    let mut q1 = store.new_ctx();
    let text: Vec<u8> = b"exporter sample "
        .iter()
        .cycle()
        .take(8192)
        .copied()
        .collect();
    q0.write(0, &text).unwrap();
    q1.write(8192, &[0u8; 4096]).unwrap();
    let flags = ["--size", "1M", "--queues", "2"];
    let config = zblk_ublk::DeviceConfig::from_flags(flags).unwrap();
    let info = zblk_ublk::control::DeviceInfo::new(id, format!("/dev/ublkb{id}"), &config, 1 << 21);
    serde_json::json!({"device": info, "stats": serde_json::to_value(store.stats()).unwrap()})
}

/// A stand-in daemon on `dir/<id>.sock` answering every `stats` request
/// with [`sample_reply`].
pub fn fake_daemon(dir: &Path, id: u32) {
    fake_daemon_with(dir, id, move |_| sample_reply(id));
}

/// A stand-in daemon on `dir/<id>.sock` answering the `n`th `stats`
/// request (from 0) with `reply(n)`.
pub fn fake_daemon_with(
    dir: &Path,
    id: u32,
    reply: impl Fn(u64) -> serde_json::Value + Send + 'static,
) {
    let l = UnixListener::bind(dir.join(format!("{id}.sock"))).unwrap();
    std::thread::spawn(move || {
        for (n, s) in (0u64..).zip(l.incoming()) {
            let mut s = s.unwrap();
            let mut req = String::new();
            BufReader::new(&s).read_line(&mut req).unwrap();
            assert_eq!(req.trim(), r#"{"cmd":"stats"}"#);
            let line = serde_json::json!({"ok": true, "data": reply(n)}).to_string();
            writeln!(s, "{line}").unwrap();
        }
    });
}
