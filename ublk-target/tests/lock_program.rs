//! `safety::lock_program` locks every page of the program's mappings, not
//! only those it ran: read back from this test's own `/proc/self/smaps`,
//! where every such mapping must be locked (`lo` in its VmFlags, without
//! `lf`, lock-on-fault) and wholly resident (Rss equal to Size; smaps'
//! `Locked` is proportional to sharing, so it is not the measure). As root
//! (CI, with CAP_IPC_LOCK), mlock is allowed whatever RLIMIT_MEMLOCK says;
//! without that the test says it skipped.

use zblk_ublk::safety::{lock_program, program_ranges};

/// One smaps entry: start, Size and Rss in kB, VmFlags.
struct Entry {
    start: usize,
    size: u64,
    rss: u64,
    flags: String,
}

fn entries(smaps: &str) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let first = f.next().unwrap_or("");
        let kb = || {
            f.clone()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        if let Some(start) = first
            .split_once('-')
            .and_then(|(a, _)| usize::from_str_radix(a, 16).ok())
        {
            out.push(Entry {
                start,
                size: 0,
                rss: 0,
                flags: String::new(),
            });
            continue;
        }
        let Some(e) = out.last_mut() else { continue };
        match first {
            "Size:" => e.size = kb(),
            "Rss:" => e.rss = kb(),
            "VmFlags:" => e.flags = line.to_string(),
            _ => {}
        }
    }
    out
}

#[test]
fn every_page_of_the_program_is_locked() {
    // Whether this process may lock more than RLIMIT_MEMLOCK: root with
    // CAP_IPC_LOCK (a container's root may lack it). Probed by locking
    // 64 MB of address space on fault, which backs nothing.
    let probe = 64 << 20;
    // SAFETY: an anonymous private mapping of our own, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            probe,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap");
    // SAFETY: mlock2/munmap on the mapping made just above.
    let allowed = unsafe {
        let ok = libc::mlock2(p, probe, libc::MLOCK_ONFAULT) == 0;
        libc::munmap(p, probe);
        ok
    };
    if !allowed {
        eprintln!("skipped: this process may not lock 64 MB (no CAP_IPC_LOCK)");
        return;
    }
    let locked = lock_program();
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    let ranges = program_ranges(&maps);
    let want: usize = ranges.iter().map(|r| r.1).sum();
    assert!(locked as usize >= want, "locked {locked} of {want} bytes");
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
    let all = entries(&smaps);
    for (start, len) in ranges {
        let e = all
            .iter()
            .find(|e| e.start == start)
            .unwrap_or_else(|| panic!("{start:#x} not in smaps"));
        assert_eq!(e.size, len as u64 / 1024, "{start:#x}");
        assert_eq!(e.rss, e.size, "{start:#x}: not all resident");
        let flags: Vec<&str> = e.flags.split_whitespace().collect();
        assert!(
            flags.contains(&"lo") && !flags.contains(&"lf"),
            "{start:#x}: {}",
            e.flags
        );
    }
}
