//! `zblk top` as people run it: the real binary over a temporary run
//! directory of stand-in daemons, piped (successive tables) and inside a
//! tmux pane (one screen, redrawn, `q` or Ctrl-C quitting).

mod common;

use common::{fake_daemon_with, sample_reply};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A device whose write counters grow by 1000 at each request; `asked`
/// counts the requests.
fn busy_daemon(dir: &Path, id: u32, asked: Arc<AtomicU64>) {
    fake_daemon_with(dir, id, move |n| {
        asked.fetch_add(1, Ordering::SeqCst);
        let mut r = sample_reply(id);
        let s = &mut r["stats"];
        for k in ["num_writes", "pages_written"] {
            s[k] = (s[k].as_u64().unwrap() + 1000 * n).into();
        }
        r
    });
}

/// The cells of the row of `name` in one frame.
fn cells<'a>(frame: &'a str, name: &str) -> Vec<&'a str> {
    let line = frame
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row {name} in:\n{frame}"));
    line.split_whitespace().collect()
}

#[test]
fn piped_top_prints_successive_tables_with_rates_and_silent_devices() {
    let dir = tempfile::tempdir().unwrap();
    busy_daemon(dir.path(), 0, Arc::default());
    // A daemon that accepts and never answers: the round's deadline ends it.
    let _stuck = UnixListener::bind(dir.path().join("1.sock")).unwrap();
    // A socket whose daemon is gone.
    drop(UnixListener::bind(dir.path().join("2.sock")).unwrap());
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_zblk"))
        .args(["top", "--iterations", "2", "--interval", "0.2", "--run-dir"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains('\x1b'), "escapes when piped: {text:?}");
    let frames: Vec<&str> = text.split("\n\n").collect();
    assert_eq!(frames.len(), 2, "{text}");
    for f in &frames {
        let lines: Vec<&str> = f.lines().collect();
        assert_eq!(lines.len(), 5, "title, header, 3 devices:\n{f}");
        assert!(
            lines[0].starts_with("zblk top: 3 device(s), every 0.2s"),
            "{f}"
        );
        let header: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            header[..6],
            ["NAME", "STORED", "DATA", "COMPR", "RATIO", "MEM-USED"]
        );
        assert_eq!(header[6..10], ["R-IOPS", "W-IOPS", "R-MB/S", "W-MB/S"]);
        assert_eq!(header[10..], ["W-P99-US", "R-P99-US", "STATE"]);
        for silent in ["/dev/ublkb1", "/dev/ublkb2"] {
            let row = cells(f, silent);
            assert_eq!(row.len(), 13, "{row:?}");
            assert_eq!(row[12], "no-answer");
        }
        let row = cells(f, "/dev/ublkb0");
        assert_eq!((row[1], row[2], row[12]), ("3", "12K", "live"), "{row:?}");
    }
    // No rates before a second sample; then 1000 writes over about the
    // second the stuck daemon made the round wait.
    assert_eq!(cells(frames[0], "/dev/ublkb0")[6..10], ["-", "-", "-", "-"]);
    let row = cells(frames[1], "/dev/ublkb0");
    let w_iops: f64 = row[7].parse().unwrap();
    let w_mbps: f64 = row[9].parse().unwrap();
    assert!((200.0..=6000.0).contains(&w_iops), "{row:?}");
    assert!((0.5..=25.0).contains(&w_mbps), "{row:?}");
    assert_eq!((row[6], row[8]), ("0", "0.0"), "nothing read: {row:?}");
}

/// A tmux server of its own (its own socket name, no configuration file),
/// killed when the test ends however it ends.
struct Tmux(String);

impl Tmux {
    fn new(tag: &str) -> Tmux {
        Tmux(format!("zblk-top-{tag}-{}", std::process::id()))
    }

    fn cmd(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.0, "-f", "/dev/null"])
            .args(args)
            .output()
            .unwrap()
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", "top"]).stdout).into()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

fn have_tmux() -> bool {
    let ok = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!("skipped: tmux is not installed (tools/scripts/deps.sh build installs it)");
    }
    ok
}

/// Waits up to 10 s for `done`, polling.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `zblk top` in a 160x30 tmux pane over two busy devices, checks the
/// screen after a few refreshes, sends `key` and checks that top exits 0
/// and left the terminal in canonical mode with echo.
fn top_in_tmux(key: &str) {
    if !have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let asked = Arc::new(AtomicU64::new(0));
    busy_daemon(dir.path(), 0, asked.clone());
    busy_daemon(dir.path(), 1, Arc::default());
    let after = dir.path().join("after");
    let script = format!(
        "'{}' top --interval 0.2 --run-dir '{}'; echo exit=$? > '{2}.tmp'; stty -a >> '{2}.tmp'; mv '{2}.tmp' '{2}'",
        env!("CARGO_BIN_EXE_zblk"),
        dir.path().display(),
        after.display()
    );
    let tmux = Tmux::new(if key == "q" { "q" } else { "ctrl-c" });
    let o = tmux.cmd(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "30",
        &script,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A few refreshes, so that a screen not cleared would show many tables.
    wait_for("3 refreshes", || asked.load(Ordering::SeqCst) >= 4);
    let mut screen = String::new();
    wait_for("the rows", || {
        screen = tmux.screen();
        ["/dev/ublkb0", "/dev/ublkb1"].iter().all(|d| {
            screen
                .lines()
                .any(|l| l.starts_with(d) && l.ends_with("live"))
        })
    });
    let headers = screen.lines().filter(|l| l.starts_with("NAME ")).count();
    assert_eq!(headers, 1, "one table on the screen:\n{screen}");
    assert_eq!(
        screen
            .lines()
            .filter(|l| l.starts_with("zblk top: 2 device(s)"))
            .count(),
        1
    );
    let row = cells(&screen, "/dev/ublkb0");
    assert!(
        row[7].parse::<f64>().is_ok_and(|w| w > 0.0),
        "write rate: {row:?}"
    );
    let o = tmux.cmd(&["send-keys", "-t", "top", key]);
    assert!(o.status.success());
    wait_for("top to exit", || after.exists());
    let text = std::fs::read_to_string(&after).unwrap();
    assert!(text.starts_with("exit=0\n"), "{text}");
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == ';')
        .collect();
    for mode in ["icanon", "echo"] {
        assert!(words.contains(&mode), "{mode} not restored: {text}");
    }
}

#[test]
fn top_in_a_terminal_redraws_one_screen_and_q_quits() {
    top_in_tmux("q");
}

#[test]
fn top_in_a_terminal_quits_cleanly_on_ctrl_c() {
    top_in_tmux("C-c");
}
