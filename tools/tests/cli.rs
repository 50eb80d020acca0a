//! The `zblk` binary as a user meets it: messages, exit codes, output.
//! Nothing here needs the ublk driver; `add` is checked for the message it
//! gives when the driver is missing.

use std::path::Path;
use std::process::{Command, Output};

fn zblk(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zblk"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run zblk")
}

/// The one line a failure prints, after checking that it is one line.
fn failure_line(o: &Output) -> String {
    assert!(!o.status.success(), "expected failure, got {:?}", o.status);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(err.lines().count(), 1, "not one line: {err:?}");
    assert!(err.starts_with("zblk: "), "{err:?}");
    err.trim_end().to_string()
}

#[test]
fn add_without_the_driver_says_how_to_load_it() {
    if Path::new("/dev/ublk-control").exists() {
        eprintln!("skipped: this machine has the ublk driver");
        return;
    }
    let o = zblk(&["add", "--size", "1G"]);
    assert_eq!(o.status.code(), Some(1));
    let line = failure_line(&o);
    assert!(line.contains("load it: modprobe ublk_drv"), "{line}");
    assert!(
        line.contains("needs Linux 6.0+ built with CONFIG_BLK_DEV_UBLK"),
        "{line}"
    );
    assert!(o.stdout.is_empty());
}

#[test]
fn add_argument_errors_are_one_line_each() {
    let cases: &[(&[&str], &str)] = &[
        (&["add", "--size", "0"], "size must not be zero"),
        (&["add", "--size", "1000"], "not a multiple of 4 KB"),
        (&["add", "--size", "6K"], "not a multiple of 4 KB"),
        (&["add", "--size", "1X"], "invalid size '1X'"),
        (
            &["add", "--size", "1G", "--algo", "lzo"],
            "unknown algorithm 'lzo'",
        ),
        (
            &["add", "--size", "1G", "--algo", "zstd:30"],
            "invalid level '30'",
        ),
        (&["add"], "--size"),
        (&["add", "--size", "1G", "--priority", "5"], "--swap"),
        (&["del"], "--all"),
        (&["frobnicate"], "unrecognized subcommand"),
        (&["writeback", "-n", "0"], "--type"),
        (&["set", "-n", "0"], "--mem-limit"),
        (
            &["writeback", "-n", "0", "--type", "idle", "--limit", "x"],
            "invalid value 'x'",
        ),
    ];
    for (args, want) in cases {
        let o = zblk(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let line = failure_line(&o);
        assert!(line.contains(want), "{args:?}: {line}");
    }
}

#[test]
fn missing_devices_are_named() {
    for args in [
        &["stat", "-n", "4000"][..],
        &["compact", "-n", "4000"],
        &["set", "-n", "4000", "--mem-limit", "1G"],
        &["set", "-n", "4000", "--writeback-limit", "100"],
        &["writeback", "-n", "4000", "--type", "idle"],
        &["del", "-n", "4000"],
    ] {
        let o = zblk(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let line = failure_line(&o);
        assert!(
            line.contains("no such device: zblk 4000"),
            "{args:?}: {line}"
        );
    }
}

#[test]
fn list_prints_zramctl_columns() {
    let o = zblk(&["list"]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "DISKSIZE",
            "DATA",
            "COMPR",
            "TOTAL",
            "ALGORITHM",
            "QUEUES",
            "ZERO-PAGES",
            "MEM-LIMIT",
            "MEM-USED",
            "SWAP",
            "STATE",
            "RECOVERY",
            "RECOVERIES",
            "MOUNTPOINT"
        ]
    );
    let o = zblk(&["list", "--json"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["devices"].is_array());
}

fn sample_file(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("zblk-cli-{}-{name}", std::process::id()));
    let mut data = Vec::new();
    for i in 0..64u32 {
        match i % 4 {
            0 => data.extend(std::iter::repeat(0u8).take(4096)),
            1 => data.extend(format!("page {i} ").bytes().cycle().take(4096)),
            2 => data.extend(
                (0..4096u32).map(|j| (j.wrapping_mul(2654435761).wrapping_add(i) >> 13) as u8),
            ),
            _ => data.extend(std::iter::repeat(i as u8).take(4096)),
        }
    }
    if name.ends_with(".zst") {
        data = zstd::encode_all(&data[..], 3).unwrap();
    }
    std::fs::write(&path, data).unwrap();
    path
}

#[test]
fn bench_runs_the_engine_and_prints_json() {
    for name in ["pages.bin", "pages.bin.zst"] {
        let input = sample_file(name);
        let o = zblk(&[
            "bench",
            "--input",
            input.to_str().unwrap(),
            "--algo",
            "zstd",
            "--threads",
            "2",
            "--json",
        ]);
        std::fs::remove_file(&input).ok();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["pages"], 64, "{name}");
        assert_eq!(v["verify_errors"], 0);
        assert_eq!(v["threads"], 2);
        assert_eq!(v["algo"], "zstd:1");
        assert!(v["ratio_data"].as_f64().unwrap() > 1.0);
    }
}

#[test]
fn bench_discard_threads_adds_deferred_and_immediate_times() {
    let input = sample_file("discard.bin");
    let o = zblk(&[
        "bench",
        "-i",
        input.to_str().unwrap(),
        "--discard-threads",
        "2",
        "--json",
    ]);
    std::fs::remove_file(&input).ok();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["discard_threads"], 2);
    assert!(v["discard_deferred_ms"].as_f64().unwrap() > 0.0);
    assert!(v["discard_immediate_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(
        v["mem_used_total_after"], 0,
        "the drain gave everything back"
    );
    let o = zblk(&["bench", "-i", "x", "--discard-threads", "0"]);
    assert!(!o.status.success());
}

#[test]
fn bench_table_and_errors() {
    let input = sample_file("table.bin");
    let o = zblk(&["bench", "-i", input.to_str().unwrap()]);
    std::fs::remove_file(&input).ok();
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["verify_errors", "0"]),
        "{out}"
    );
    let o = zblk(&["bench", "--input", "/nonexistent/pages"]);
    assert!(failure_line(&o).contains("cannot read /nonexistent/pages"));
}
