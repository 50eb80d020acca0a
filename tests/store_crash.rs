//! Crash consistency: a child process runs a store in shared memory and is
//! killed (`_exit`, as `kill -9` would leave its memory) at one crash point
//! of the write, discard, compaction, packed-rewrite, recompression,
//! writeback, backing store compaction or free paths; this
//! process recovers the store from the child's memfd and checks every page
//! against a model: a page the interrupted operation touched reads as its
//! old or its new content, every other page as the model says; and once
//! everything is discarded no memory is left (nothing leaked). The loop
//! runs over every crash point the workload passes through.

mod common;

use common::{page, real_pages, Content, Rng};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use zblk::{Mode, Store, StoreConfig, PAGE_SIZE};

const P: u64 = PAGE_SIZE as u64;
const PAGES: u64 = 96;

/// The child's backing file, which the parent names in `ZBLK_CRASH_BD`
/// (it outlives each child, as a backing device outlives its daemon).
fn backing() -> PathBuf {
    std::env::var_os("ZBLK_CRASH_BD")
        .map(Into::into)
        .expect("ZBLK_CRASH_BD names the backing file")
}

fn config(mode: Mode, bd: &Path) -> StoreConfig {
    let mut cfg = StoreConfig::new(PAGES * P);
    cfg.shared = true;
    cfg.mode = mode;
    cfg.backing = Some(bd.to_path_buf());
    cfg
}

/// Makes a backing file of `PAGES` blocks, in a directory that lives as
/// long as the returned guard.
fn make_backing() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("backing");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(PAGES * P)
        .unwrap();
    (dir, path)
}

enum Op {
    Write(u64, Vec<u8>),
    Discard(u64, u64),
    Compact,
    /// Marks every page idle and recompresses a few idle ones (into packed
    /// groups in a packed store).
    Recompress,
    /// Marks every page idle and writes a few idle ones back (a packed
    /// store: the groups whose live pages fit the limit, whole).
    Writeback,
    /// Compacts the backing store (the per-page objects and packed groups
    /// of its sparse blocks).
    CompactBacking,
}

/// The workload: fill the device, punch holes so that compaction has
/// objects to move and packed groups to rewrite, compact, then mixed
/// writes and discards with one more compaction.
fn workload() -> Vec<Op> {
    let real = real_pages();
    let real_n = (real.len() / PAGE_SIZE) as u64;
    let mut rng = Rng(42);
    let content = |rng: &mut Rng| match rng.below(5) {
        0 | 1 => {
            let i = rng.below(real_n) as usize;
            real[i * PAGE_SIZE..(i + 1) * PAGE_SIZE].to_vec()
        }
        2 => page(Content::SameWord(rng.next()), &[]),
        3 => page(Content::Random(rng.next()), &[]),
        _ => page(Content::Text(rng.next()), &[]),
    };
    let mut ops = Vec::new();
    // Pages of one kind compress to similar sizes: few size classes, whose
    // zspages the holes below leave sparse enough to compact.
    for first in (0..PAGES).step_by(16) {
        let data = (0..16)
            .flat_map(|i| page(Content::Text(first + i), &[]))
            .collect();
        ops.push(Op::Write(first * P, data));
    }
    for p in (0..PAGES).step_by(8) {
        ops.push(Op::Discard((p + 1) * P, 5 * P));
    }
    ops.push(Op::Compact);
    ops.push(Op::Recompress);
    ops.push(Op::Writeback);
    for i in 0..12 {
        if i == 6 {
            // Another writeback between writes: `writeback:written` is
            // passed once per writeback, and the drain thread's own crash
            // points may take the numbers of one pass.
            ops.push(Op::Writeback);
        }
        let n = 1 + rng.below(8);
        let first = rng.below(PAGES - n + 1);
        if i % 3 == 2 {
            ops.push(Op::Discard(first * P, n * P));
        } else {
            let data = (0..n).flat_map(|_| content(&mut rng)).collect();
            ops.push(Op::Write(first * P, data));
        }
    }
    ops.push(Op::Writeback);
    // Holes in what was written back, for the backing store's compaction.
    for p in (0..PAGES).step_by(4) {
        ops.push(Op::Discard((p + 1) * P, 2 * P));
    }
    ops.push(Op::CompactBacking);
    // A second round over the blocks the first one wrote, thinned again:
    // `backing-compact:written` is passed once per batch written, and the
    // drain thread's own crash points may take the numbers of one round.
    for p in (0..PAGES).step_by(4) {
        ops.push(Op::Discard((p + 3) * P, P));
    }
    ops.push(Op::CompactBacking);
    ops.push(Op::Compact);
    ops
}

/// The model after each prefix of the workload: `states[k]` is every
/// page's content after the first `k` operations.
fn states(ops: &[Op]) -> Vec<Vec<Vec<u8>>> {
    let mut cur = vec![vec![0u8; PAGE_SIZE]; PAGES as usize];
    let mut all = vec![cur.clone()];
    for op in ops {
        match op {
            Op::Write(off, data) => {
                for (i, pg) in data.chunks(PAGE_SIZE).enumerate() {
                    cur[(off / P) as usize + i] = pg.to_vec();
                }
            }
            Op::Discard(off, len) => {
                for p in off / P..(off + len) / P {
                    cur[p as usize].fill(0);
                }
            }
            Op::Compact | Op::Recompress | Op::Writeback | Op::CompactBacking => {}
        }
        all.push(cur.clone());
    }
    all
}

/// The child: builds the store, tells the parent its memfd, waits for the
/// go, then runs the workload, announcing each operation before it starts.
#[test]
fn crash_child() {
    let Ok(mode) = std::env::var("ZBLK_CRASH_CHILD") else {
        return; // run as a test of its own: nothing to do
    };
    let mode: Mode = mode.parse().unwrap();
    let store = Store::new(config(mode, &backing())).unwrap();
    let mut ctx = store.new_ctx();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&store.memory_fd().unwrap());
    let mut out = std::io::stdout().lock();
    writeln!(out, "ZBLK fd {fd}").unwrap();
    out.flush().unwrap();
    let mut go = [0u8; 1];
    std::io::stdin().read_exact(&mut go).unwrap();
    for (j, op) in workload().into_iter().enumerate() {
        writeln!(out, "ZBLK op {j}").unwrap();
        out.flush().unwrap();
        match op {
            Op::Write(off, data) => ctx.write(off, &data).unwrap(),
            Op::Discard(off, len) => ctx.discard(off, len).unwrap(),
            Op::Compact => {
                ctx.flush_frees();
                store.compact();
            }
            Op::Recompress => {
                store.mark_idle(None).unwrap();
                let r = store.recompress(&zblk::Recompress {
                    algos: vec![zblk::Algo::Zstd(19)],
                    kind: zblk::RecompressType::Idle,
                    threshold: 0,
                    max_pages: 6,
                    pages: Vec::new(),
                });
                assert!(r.is_ok(), "{mode}: {r:?}");
            }
            Op::Writeback => {
                store.mark_idle(None).unwrap();
                let r = store.writeback(&zblk::Writeback {
                    select: zblk::WritebackType::Idle.into(),
                    limit: 6,
                });
                assert!(r.is_ok(), "{mode}: {r:?}");
            }
            Op::CompactBacking => {
                let r = store.compact_backing(u64::MAX);
                assert!(r.is_ok(), "{mode}: {r:?}");
            }
        }
    }
    drop(ctx);
    store.settle_frees(std::time::Duration::from_secs(5));
    writeln!(out, "ZBLK done {}", zblk::testing::crash_points_passed()).unwrap();
    out.flush().unwrap();
}

/// How a child run ended.
struct Run {
    memory: OwnedFd,
    /// The last operation the child started.
    last_op: Option<usize>,
    /// Crash points passed in a complete run.
    done: Option<u64>,
    /// The crash point the child died at.
    crashed_at: Option<String>,
}

fn run_child(mode: Mode, bd: &Path, at: u64) -> Run {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env("ZBLK_CRASH_CHILD", mode.to_string())
        .env("ZBLK_CRASH_AT", at.to_string())
        .env("ZBLK_CRASH_BD", bd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // libtest may print "test crash_child ... " in front of a line.
    let mut lines = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| l.find("ZBLK ").map(|i| l[i..].to_string()));
    let fd_line = lines
        .by_ref()
        .find_map(|l| l.strip_prefix("ZBLK fd ").map(str::to_string))
        .expect("the child names its memfd");
    let path = format!("/proc/{}/fd/{fd_line}", child.id());
    let memory: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap()
        .into();
    child.stdin.take().unwrap().write_all(b"g").unwrap();
    let mut run = Run {
        memory,
        last_op: None,
        done: None,
        crashed_at: None,
    };
    for l in lines {
        if let Some(j) = l.strip_prefix("ZBLK op ") {
            run.last_op = j.parse().ok();
        } else if let Some(n) = l.strip_prefix("ZBLK done ") {
            run.done = n.parse().ok();
        } else if let Some(c) = l.strip_prefix("ZBLK crash ") {
            run.crashed_at = c.split(' ').nth(1).map(str::to_string);
        }
    }
    let status = child.wait().unwrap();
    assert!(
        run.done.is_some() || status.code() == Some(77),
        "child ended with {status} at point {at}"
    );
    run
}

/// Recovers the child's store and checks it against the model.
fn check(mode: Mode, bd: &Path, run: Run, states: &[Vec<Vec<u8>>], at: u64) {
    let store = Store::recover(config(mode, bd), run.memory)
        .unwrap_or_else(|e| panic!("crash at point {at}: recovery failed: {e}"));
    let (before, after) = match (run.done, run.last_op) {
        (Some(_), _) => (states.len() - 1, states.len() - 1),
        (None, Some(j)) => (j, j + 1),
        (None, None) => (0, 0),
    };
    let mut ctx = store.new_ctx();
    let mut buf = vec![0u8; PAGE_SIZE];
    for (p, (old, new)) in states[before].iter().zip(&states[after]).enumerate() {
        ctx.read(p as u64 * P, &mut buf).unwrap();
        assert!(
            &buf == old || &buf == new,
            "crash at point {at} ({:?}) during op {before}: page {p} is neither old nor new",
            run.crashed_at
        );
    }
    assert_eq!(store.stats().recovery_dropped, 0, "point {at}");
    ctx.discard(0, PAGES * P).unwrap();
    drop(ctx);
    // A stat waits only 200 ms for the drain; on a loaded machine the
    // frees can take longer, which is no leak.
    assert!(
        store.settle_frees(std::time::Duration::from_secs(10)),
        "point {at}"
    );
    let st = store.stats();
    assert_eq!(st.counters.stored_pages, 0, "point {at}");
    assert_eq!(st.counters.compr_data_size, 0, "point {at}");
    assert_eq!(st.counters.packed_dead_bytes, 0, "point {at}");
    assert_eq!(st.counters.bd_count, 0, "point {at}");
    assert_eq!(
        st.bd_used_bytes, 0,
        "crash at point {at}: backing blocks left in use"
    );
    assert_eq!(
        st.mem_used_total, 0,
        "crash at point {at} ({:?}): memory leaked across the recovery",
        run.crashed_at
    );
}

fn crash_everywhere(mode: Mode) -> Vec<String> {
    let (_dir, bd) = make_backing();
    let states = states(&workload());
    let full = run_child(mode, &bd, 0);
    let points = full.done.expect("a run without a crash completes");
    check(mode, &bd, full, &states, 0);
    let mut names = Vec::new();
    for at in 1..=points {
        let run = run_child(mode, &bd, at);
        if let Some(name) = &run.crashed_at {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        check(mode, &bd, run, &states, at);
    }
    names.sort();
    eprintln!("{mode}: crashed at each of {points} points: {names:?}");
    names
}

#[test]
fn per_page_store_survives_a_crash_at_every_point() {
    let names = crash_everywhere(Mode::PerPage);
    for want in [
        "backing-compact:locked",
        "backing-compact:released",
        "backing-compact:written",
        "compact:moved",
        "free:batch",
        "install:locked",
        "install:released",
        "install:swapped",
        "recompress:locked",
        "recompress:planned",
        "recompress:released",
        "relocate:copied",
        "relocate:holder",
        "write:planned",
        "writeback:locked",
        "writeback:released",
        "writeback:written",
    ] {
        assert!(names.iter().any(|n| n == want), "never crashed at {want}");
    }
}

#[test]
fn packed_store_survives_a_crash_at_every_point() {
    let names = crash_everywhere(Mode::Packed);
    for want in [
        "backing-compact:group-locked",
        "backing-compact:group-released",
        "backing-compact:written",
        "install:locked",
        "pack:allocated",
        "pack:header",
        "recompress:group-locked",
        "recompress:group-written",
        "rewrite:locked",
        "rewrite:planned",
        "rewrite:released",
        "write:planned",
        "writeback:group-locked",
        "writeback:group-released",
        "writeback:written",
    ] {
        assert!(names.iter().any(|n| n == want), "never crashed at {want}");
    }
}
