//! `zblk exporter` over a real TCP connection, with its control sockets in
//! a temporary directory: none at all, or stand-in daemons that answer,
//! are gone, or never answer.

mod common;

use common::fake_daemon;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The exporter process, killed when the test ends however it ends.
struct Exporter {
    child: Child,
    addr: String,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `zblk exporter` on an ephemeral loopback port over `run_dir`.
fn start(run_dir: &Path) -> Exporter {
    let mut child = Command::new(env!("CARGO_BIN_EXE_zblk"))
        .args(["exporter", "--listen", "127.0.0.1:0", "--timeout", "1"])
        .arg("--run-dir")
        .arg(run_dir)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the exporter");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("zblk exporter: listening on http://")
        .and_then(|s| s.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("first line: {line:?}"))
        .to_string();
    Exporter { child, addr }
}

/// One HTTP GET: the status code and the body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").expect("a full response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

fn parse(body: &str) -> prometheus_parse::Scrape {
    let lines = body.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines).expect("the body parses")
}

/// The value of the one sample of `name` whose labels include `want`.
fn value(p: &prometheus_parse::Scrape, name: &str, want: &[(&str, &str)]) -> f64 {
    let hits: Vec<_> = p
        .samples
        .iter()
        .filter(|s| s.metric == name && want.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect();
    assert_eq!(hits.len(), 1, "{name} {want:?}");
    match hits[0].value {
        prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
        ref v => panic!("{name}: {v:?}"),
    }
}

#[test]
fn no_devices_serves_an_empty_exposition_and_404_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let x = start(&dir.path().join("absent"));
    let (status, body) = get(&x.addr, "/metrics");
    assert_eq!(status, 200);
    assert_eq!(body, "");
    assert_eq!(get(&x.addr, "/").0, 404);
    assert_eq!(get(&x.addr, "/metricsx").0, 404);
}

#[test]
fn scrape_parses_and_skips_devices_that_do_not_answer() {
    let dir = tempfile::tempdir().unwrap();
    fake_daemon(dir.path(), 0);
    // A socket whose daemon is gone: connect is refused.
    drop(UnixListener::bind(dir.path().join("1.sock")).unwrap());
    // A daemon that accepts and never answers: the timeout must end it.
    let _stuck = UnixListener::bind(dir.path().join("2.sock")).unwrap();
    let x = start(dir.path());
    let t = Instant::now();
    let (status, body) = get(&x.addr, "/metrics?x=1");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(status, 200, "{body}");
    let p = parse(&body);
    let dev0 = [("device", "ublkb0"), ("id", "0")];
    assert_eq!(value(&p, "zblk_up", &dev0), 1.0);
    assert_eq!(value(&p, "zblk_up", &[("id", "1")]), 0.0);
    assert_eq!(value(&p, "zblk_up", &[("id", "2")]), 0.0);
    assert_eq!(value(&p, "zblk_stored_pages", &dev0), 3.0);
    assert_eq!(value(&p, "zblk_same_pages", &dev0), 1.0);
    let q1 = [("id", "0"), ("queue", "1")];
    assert_eq!(value(&p, "zblk_queue_pages_written_total", &q1), 1.0);
    // Only the answering device has series beyond zblk_up.
    assert!(p
        .samples
        .iter()
        .all(|s| s.metric == "zblk_up" || s.labels.get("id") == Some("0")));
    assert_eq!(get(&x.addr, "/stats").0, 404);
}
