//! Keeps a store's memory resident while no daemon maps it.
//!
//! A daemon maps its store's memfd under `mlockall(MCL_FUTURE)`, so every
//! page of the store is locked while the daemon lives. From its death until
//! the next daemon has mapped the file again (a few hundred ms), nothing
//! locks them: under the memory pressure that swap on zblk implies, reclaim
//! may pick those shmem pages and write them to swap, possibly to this very
//! device, whose I/O the driver holds until the new daemon serves; and the
//! new daemon reads those pages to recover, so it would wait on itself.
//!
//! So the keeper, as soon as it sees the daemon go, maps the file's
//! populated extents (found with `SEEK_DATA`/`SEEK_HOLE`) into its own
//! address space and `mlock`s them. The keeper's `mlockall` has
//! `MCL_ONFAULT`, which would lock a page only once the keeper touched it;
//! the explicit `mlock` locks every page of the extent now. A locked
//! mapping makes its pages unevictable whoever else maps them. Holes are never
//! mapped: faulting one in would allocate memory the store never used (the
//! file is about a petabyte of address space, almost all of it holes). The
//! new daemon locks the pages again in its own mappings; once it serves,
//! the keeper lets go.

use std::os::fd::{AsRawFd, BorrowedFd};

/// Most extents mapped: well under the default `vm.max_map_count` (65530),
/// which the keeper's own mappings share.
const MAX_EXTENTS: usize = 16384;

/// The store's populated extents, mapped and locked in this process.
#[derive(Debug)]
pub struct Pinned {
    maps: Vec<(usize, usize)>,
    bytes: u64,
}

impl Pinned {
    /// Maps and locks every populated extent of `fd` (at most
    /// [`MAX_EXTENTS`]; the rest stay as they are, with a warning). A
    /// mapping that fails is skipped: pinning only narrows a window, the
    /// recovery does not depend on it.
    pub fn new(fd: BorrowedFd<'_>) -> Pinned {
        let mut p = Pinned {
            maps: Vec::new(),
            bytes: 0,
        };
        let extents = extents(fd);
        if extents.len() > MAX_EXTENTS {
            log::warn!(
                "store has {} extents; pinning the first {MAX_EXTENTS}",
                extents.len()
            );
        }
        for &(start, len) in extents.iter().take(MAX_EXTENTS) {
            p.map(fd, start, len);
        }
        p
    }

    /// Bytes pinned (mapped and locked).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn map(&mut self, fd: BorrowedFd<'_>, start: u64, len: u64) {
        let (Ok(off), Ok(n)) = (libc::off_t::try_from(start), usize::try_from(len)) else {
            return;
        };
        // SAFETY: a new read-only shared mapping of `n` bytes of a file we
        // hold, at an address the kernel picks; no Rust object aliases it
        // and it is only ever unmapped by Drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            log::warn!(
                "cannot pin {len} bytes of the store at {start:#x}: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        self.maps.push((p as usize, n));
        // SAFETY: the range is the mapping just made.
        if unsafe { libc::mlock(p, n) } != 0 {
            log::warn!(
                "cannot lock {len} bytes of the store at {start:#x}: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        self.bytes += len;
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        for &(addr, len) in &self.maps {
            // SAFETY: (addr, len) is a mapping this value made and nothing
            // else refers to.
            unsafe { libc::munmap(addr as *mut libc::c_void, len) };
        }
    }
}

/// The populated extents of `fd`, as (offset, length), in order.
fn extents(fd: BorrowedFd<'_>) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at: libc::off_t = 0;
    loop {
        // SAFETY: lseek on a descriptor we hold; no memory is involved.
        let data = unsafe { libc::lseek(fd.as_raw_fd(), at, libc::SEEK_DATA) };
        if data < 0 {
            // ENXIO: no data past `at`.
            return out;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd.as_raw_fd(), data, libc::SEEK_HOLE) };
        if hole <= data {
            return out;
        }
        out.push((data as u64, (hole - data) as u64));
        at = hole;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    use std::os::unix::fs::FileExt;

    fn memfd() -> std::fs::File {
        // SAFETY: memfd_create with a NUL-terminated name; a valid result is
        // a new descriptor we own.
        let fd = unsafe { libc::memfd_create(c"pin-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fd is fresh and owned by nobody else.
        std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    #[test]
    fn pins_exactly_the_populated_extents() {
        let f = memfd();
        // A sparse file like a store's: 1 PB of address space, data in
        // three places.
        f.set_len(1 << 50).unwrap();
        f.write_all_at(&[1u8; 8192], 0).unwrap();
        f.write_all_at(&[2u8; 4096], 1 << 30).unwrap();
        f.write_all_at(&[3u8; 4096 * 3], 1 << 45).unwrap();
        assert_eq!(
            extents(f.as_fd()),
            vec![(0, 8192), (1 << 30, 4096), (1 << 45, 12288)]
        );
        let p = Pinned::new(f.as_fd());
        assert_eq!(p.bytes(), 8192 + 4096 + 12288);
        assert_eq!(p.maps.len(), 3);
        // The holes stayed holes: the file still holds 6 pages.
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat writes one stat into `st`.
        assert_eq!(unsafe { libc::fstat(f.as_raw_fd(), st.as_mut_ptr()) }, 0);
        // SAFETY: fstat succeeded, so `st` is initialized.
        let blocks = unsafe { st.assume_init() }.st_blocks;
        assert_eq!(blocks * 512, 6 * 4096);
        // Locked, in this process: VmLck counts them (the test process
        // locks nothing else; as root, or within RLIMIT_MEMLOCK).
        let locked_kb = std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmLck:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
            .unwrap();
        assert!(locked_kb >= 24, "VmLck {locked_kb} kB, want >= 24");
        // The mappings show the file's bytes.
        let (addr, _) = p.maps[2];
        // SAFETY: the mapping is live and at least one byte long.
        assert_eq!(unsafe { *(addr as *const u8) }, 3);
    }

    #[test]
    fn an_empty_file_pins_nothing() {
        let f = memfd();
        f.set_len(1 << 40).unwrap();
        let p = Pinned::new(f.as_fd());
        assert_eq!(p.bytes(), 0);
    }
}
