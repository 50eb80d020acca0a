//! stallwatch: notices when a swapping machine stops making progress, and
//! captures what explains it before it ends the workload.
//!
//! Every second it reads the machine's swap traffic (`pswpin`, `pswpout` in
//! /proc/vmstat) and the page faults the workload has completed (`minflt` +
//! `majflt` of every process named `--comm`). Any of them moving is
//! progress. CPU time is not: a process looping in direct reclaim burns
//! system time without completing a fault, and the kernel counts a fault
//! only when it is done.
//!
//! When nothing has moved for `--quiet` seconds it captures, as lines on
//! its output (and the console with `--console`): SysRq `t`, `w`, `m` and
//! `l` (the console loglevel raised for them, so the kernel prints them on
//! the console as well as in its log), /proc/meminfo, /proc/vmstat,
//! /proc/pressure/memory, the kernel stack of every thread of each
//! `--stack-pid` process, of kswapd and of the workload, and what
//! `zblk stat -n ID` says (at most 10 s); then it kills the workload
//! (SIGKILL) and exits 3. When the process `--pid` ends it exits 0 and
//! prints the longest quiet time it saw.
//!
//! It locks itself in memory and runs at `SCHED_FIFO` 2, so that it keeps
//! running where a shell loop cannot (a shell forks, and its pages, on the
//! guest's tmpfs root, can be swapped out onto the stalled device itself).
//!
//! `stallwatch --pid 123 --comm usemem --quiet 60 --stack-pid 99 --zblk-id 0 --console`

use clap::Parser;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// Command line of stallwatch.
#[derive(Parser, Debug)]
#[command(about = "detect a swap stall, capture why, end the workload")]
struct Args {
    /// The workload's process: stallwatch ends when it does.
    #[arg(long)]
    pid: u32,
    /// Name (comm) of the workload's processes, whose faults are progress.
    #[arg(long, default_value = "usemem")]
    comm: String,
    /// Seconds without progress that make a stall.
    #[arg(long, default_value_t = 60)]
    quiet: u64,
    /// Seconds between the status lines it prints while all is well.
    #[arg(long, default_value_t = 20)]
    every: u64,
    /// A process whose threads' kernel stacks a capture shows (the zblk
    /// daemon, its keeper); repeatable.
    #[arg(long)]
    stack_pid: Vec<u32>,
    /// The zblk device whose `zblk stat` a capture shows.
    #[arg(long)]
    zblk_id: Option<u32>,
    /// A file whose last lines a capture shows (the kernel's trace
    /// buffer: the daemon's page faults); repeatable. Read into memory
    /// reserved at start ([`TAIL_ROOM`]), so a capture allocates nothing.
    #[arg(long)]
    tail: Vec<String>,
    /// Also write every line to /dev/console.
    #[arg(long)]
    console: bool,
}

/// Bytes reserved at start for reading a `--tail` file.
const TAIL_ROOM: usize = 4 << 20;
/// Lines of a `--tail` file a capture shows.
const TAIL_LINES: usize = 300;

/// Where the machine and the workload stand: what progress is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Progress {
    pswpin: u64,
    pswpout: u64,
    /// Faults the workload's processes have completed (minor + major).
    faults: u64,
}

/// The value of field `key` in /proc/vmstat's text.
fn vmstat_field(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The name and the minor + major faults in one /proc/PID/stat line; None
/// when the line is not one. The name is in parentheses and may hold spaces
/// and parentheses itself, so the fields are counted from the last `)`.
fn stat_faults(line: &str) -> Option<(&str, u64)> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let comm = line.get(open + 1..close)?;
    // After ") ": state(3) ppid(4) pgrp(5) session(6) tty_nr(7) tpgid(8)
    // flags(9) minflt(10) cminflt(11) majflt(12).
    let rest: Vec<&str> = line.get(close + 2..)?.split_whitespace().collect();
    let minflt: u64 = rest.get(7)?.parse().ok()?;
    let majflt: u64 = rest.get(9)?.parse().ok()?;
    Some((comm, minflt + majflt))
}

/// The pids of every process named `comm`.
fn pids_named(comm: &str) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == comm)
        })
        .collect()
}

/// The machine's swap traffic and the faults of the processes named `comm`.
fn read_progress(comm: &str) -> Progress {
    let vm = fs::read_to_string("/proc/vmstat").unwrap_or_default();
    let faults = pids_named(comm)
        .iter()
        .filter_map(|pid| fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|l| stat_faults(&l).map(|(_, f)| f))
        .sum();
    Progress {
        pswpin: vmstat_field(&vm, "pswpin"),
        pswpout: vmstat_field(&vm, "pswpout"),
        faults,
    }
}

/// Tells the time since the last progress, and whether that makes a stall.
#[derive(Debug)]
struct QuietClock {
    last: Progress,
    since: Instant,
    longest: Duration,
}

impl QuietClock {
    fn new(now: Progress, at: Instant) -> Self {
        QuietClock {
            last: now,
            since: at,
            longest: Duration::ZERO,
        }
    }

    /// Takes a reading at `at`; returns how long nothing has moved.
    fn observe(&mut self, now: Progress, at: Instant) -> Duration {
        if now != self.last {
            self.last = now;
            self.since = at;
        }
        let quiet = at.saturating_duration_since(self.since);
        self.longest = self.longest.max(quiet);
        quiet
    }
}

/// Prints a line to stdout and, when asked, to the console.
struct Out {
    console: Option<File>,
}

impl Out {
    fn line(&mut self, s: &str) {
        let text = format!("[stallwatch] {s}\n");
        let _ = std::io::stdout().write_all(text.as_bytes());
        let _ = std::io::stdout().flush();
        if let Some(c) = self.console.as_mut() {
            let _ = c.write_all(text.as_bytes());
        }
    }

    /// Prints each line of `text` under a heading.
    fn block(&mut self, heading: &str, text: &str) {
        self.line(&format!("--- {heading}"));
        for l in text.lines() {
            self.line(l);
        }
    }
}

/// Locks every page of this process, now and later, and raises it to
/// SCHED_FIFO 2; says so when either is refused (it still watches).
fn harden(out: &mut Out) {
    // SAFETY: mlockall takes flags only and touches no memory of ours.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
        out.line(&format!("mlockall: {}", std::io::Error::last_os_error()));
    }
    let param = libc::sched_param { sched_priority: 2 };
    // SAFETY: param is a valid sched_param for the call's duration.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        out.line(&format!("SCHED_FIFO: {}", std::io::Error::last_os_error()));
    }
}

/// SysRq `keys` through /proc/sysrq-trigger, with the console loglevel at 8
/// meanwhile so the dumps reach the console, not only the kernel's log.
fn sysrq(out: &mut Out, keys: &str) {
    let printk = fs::read_to_string("/proc/sys/kernel/printk").unwrap_or_default();
    let level = printk.split_whitespace().next().unwrap_or("4").to_string();
    let _ = fs::write("/proc/sys/kernel/printk", "8");
    for k in keys.chars() {
        out.line(&format!("sysrq {k}"));
        if let Err(e) = OpenOptions::new()
            .write(true)
            .open("/proc/sysrq-trigger")
            .and_then(|mut f| f.write_all(k.to_string().as_bytes()))
        {
            out.line(&format!("sysrq {k}: {e}"));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let _ = fs::write("/proc/sys/kernel/printk", level);
}

/// Every thread of process `pid`: name, state, wchan and kernel stack.
fn thread_stacks(pid: u32) -> String {
    let mut s = String::new();
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("pid {pid}: gone\n");
    };
    for t in dir.filter_map(|e| e.ok()) {
        let p = t.path();
        let read = |f: &str| fs::read_to_string(p.join(f)).unwrap_or_default();
        let state = read("stat")
            .rsplit_once(") ")
            .map(|(_, r)| r.chars().next().unwrap_or('?'))
            .unwrap_or('?');
        s += &format!(
            "pid {pid} tid {} {} state {state} wchan {}\n",
            t.file_name().to_string_lossy(),
            read("comm").trim_end(),
            read("wchan"),
        );
        for frame in read("stack").lines() {
            s += &format!("    {frame}\n");
        }
    }
    s
}

/// What `zblk stat -n id` prints, given at most 10 s.
fn zblk_stat(id: u32) -> String {
    let child = Command::new("zblk")
        .args(["stat", "-n", &id.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return format!("zblk stat: {e}"),
    };
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if t0.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(100))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return "zblk stat: no answer within 10 s".into();
            }
        }
    }
    match child.wait_with_output() {
        Ok(o) => {
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
        }
        Err(e) => format!("zblk stat: {e}"),
    }
}

/// The last `n` lines of `path`, read into `room` (its capacity reserved
/// before memory ran short).
fn tail_of<'a>(path: &str, room: &'a mut String, n: usize) -> &'a str {
    use std::io::Read;
    room.clear();
    if let Err(e) = File::open(path).and_then(|mut f| f.read_to_string(room)) {
        *room = format!("{path}: {e}");
        return room;
    }
    last_lines(room, n)
}

/// The last `n` lines of `text` (a final newline ends the last line).
fn last_lines(text: &str, n: usize) -> &str {
    let body = text.strip_suffix('\n').unwrap_or(text);
    let start = body
        .rmatch_indices('\n')
        .nth(n.saturating_sub(1))
        .map_or(0, |(i, _)| i + 1);
    if n == 0 {
        return "";
    }
    &body[start..]
}

/// Everything a stall report needs, in the order the most telling first.
fn capture(out: &mut Out, args: &Args, room: &mut String) {
    sysrq(out, "twml");
    for f in ["meminfo", "vmstat", "pressure/memory"] {
        let text = fs::read_to_string(format!("/proc/{f}")).unwrap_or_else(|e| e.to_string());
        out.block(&format!("/proc/{f}"), &text);
    }
    let mut pids = args.stack_pid.clone();
    pids.extend(pids_named("kswapd0"));
    pids.extend(pids_named(&args.comm));
    for pid in pids {
        out.block(&format!("stacks of {pid}"), &thread_stacks(pid));
    }
    for path in &args.tail {
        let text = tail_of(path, room, TAIL_LINES);
        out.block(&format!("last {TAIL_LINES} lines of {path}"), text);
    }
    if let Some(id) = args.zblk_id {
        out.block(&format!("zblk stat -n {id}"), &zblk_stat(id));
    }
}

/// Whether process `pid` is still there (and not a zombie).
fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|l| l.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

fn run(args: &Args) -> ExitCode {
    let console = if args.console {
        OpenOptions::new().write(true).open("/dev/console").ok()
    } else {
        None
    };
    let mut out = Out { console };
    harden(&mut out);
    // Reserved now, locked and backed by `harden`'s mlockall.
    let mut room = String::with_capacity(if args.tail.is_empty() { 0 } else { TAIL_ROOM });
    let t0 = Instant::now();
    let mut clock = QuietClock::new(read_progress(&args.comm), t0);
    let mut tick = 0u64;
    while alive(args.pid) {
        std::thread::sleep(Duration::from_secs(1));
        tick += 1;
        let now = read_progress(&args.comm);
        let quiet = clock.observe(now, Instant::now());
        if tick % args.every.max(1) == 0 {
            out.line(&format!(
                "at {} s: pswpout={} pswpin={} faults={} quiet={} s",
                t0.elapsed().as_secs(),
                now.pswpout,
                now.pswpin,
                now.faults,
                quiet.as_secs()
            ));
        }
        if quiet >= Duration::from_secs(args.quiet) {
            out.line(&format!(
                "STALL: no swap traffic and no fault of {} for {} s; capturing",
                args.comm,
                quiet.as_secs()
            ));
            capture(&mut out, args, &mut room);
            for pid in pids_named(&args.comm) {
                // SAFETY: kill takes a pid and a signal and touches no memory.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
            out.line("STALL: workload killed");
            return ExitCode::from(3);
        }
    }
    out.line(&format!(
        "workload ended after {} s; longest quiet {} s",
        t0.elapsed().as_secs(),
        clock.longest.as_secs()
    ));
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    run(&Args::parse())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_are_cut_at_newlines() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc");
        assert_eq!(last_lines("a\nb\nc", 2), "b\nc");
        assert_eq!(last_lines("a\nb\n", 5), "a\nb");
        assert_eq!(last_lines("a\nb\n", 0), "");
        assert_eq!(last_lines("", 3), "");
    }

    #[test]
    fn vmstat_fields_are_found_by_whole_name() {
        let text = "pswpin 12\npswpout 345\nzswpout 7\n";
        assert_eq!(vmstat_field(text, "pswpout"), 345);
        assert_eq!(vmstat_field(text, "pswpin"), 12);
        assert_eq!(vmstat_field(text, "swpout"), 0);
    }

    #[test]
    fn stat_faults_counts_from_the_last_parenthesis() {
        // A name with a space and a parenthesis of its own.
        let line = "42 (a b) c) S 1 42 42 0 -1 4194560 100 7 5 0 1 2 0 0 20 0 1 0";
        assert_eq!(stat_faults(line), Some(("a b) c", 105)));
        assert_eq!(stat_faults("garbage"), None);
        assert_eq!(stat_faults("1 (x) S 1"), None);
    }

    #[test]
    fn the_quiet_clock_restarts_on_any_progress() {
        let t0 = Instant::now();
        let p = Progress::default();
        let mut c = QuietClock::new(p, t0);
        assert_eq!(c.observe(p, t0 + Duration::from_secs(30)).as_secs(), 30);
        let moved = Progress { faults: 1, ..p };
        assert_eq!(c.observe(moved, t0 + Duration::from_secs(31)).as_secs(), 0);
        assert_eq!(c.observe(moved, t0 + Duration::from_secs(40)).as_secs(), 9);
        assert_eq!(c.longest.as_secs(), 30);
    }
}
