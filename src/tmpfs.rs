//! The file a recoverable store lives in, on a tmpfs of the store's own
//! that gives it 2 MB pages.
//!
//! # Why
//!
//! Every page a store grows by is a fresh page of its file, faulted in,
//! zeroed and locked one 4 KB page at a time: on a memfd that is 2-5 µs a
//! page natively, the largest cost of a write that allocates. One fault of
//! a 2 MB page brings 512 pages at once. A memfd gets huge pages only when
//! the system-wide `/sys/kernel/mm/transparent_hugepage/shmem_enabled`
//! says so (Debian: `never`), and zblk never changes a system-wide
//! setting; a tmpfs mount's `huge=` option is the mount's own.
//!
//! # How
//!
//! The new mount API makes a tmpfs instance that is attached nowhere
//! (`fsopen`, `fsconfig` with `huge=always` and `size=0`, no limit, as a
//! memfd has none; `fsmount`), and `O_TMPFILE` makes a file on it with no
//! name: like a memfd, the file lives exactly as long as a descriptor
//! (the daemon's, the keeper's, systemd's fd store) refers to it, and
//! nobody can find it by a path. Needs `CAP_SYS_ADMIN` (the daemon keeps
//! it) and Linux 5.2.
//!
//! Where a 2 MB page cannot be had at fault time (memory fragmented), the
//! kernel falls back to 4 KB pages of the same file: nothing fails. Such a
//! fault must not compact memory on a queue thread's behalf: with THP
//! `defrag` at `always` it would (synchronous compaction for every huge
//! fault), so then the store keeps to a memfd. Under any other `defrag`
//! setting a fault in a mapping without `MADV_HUGEPAGE` (the store never
//! asks for one) tries once without reclaim or compaction.
//!
//! Which mappings get 2 MB pages is the mapper's choice
//! (`crate::shm::Pages`): a mapping marked `MADV_NOHUGEPAGE` gets 4 KB
//! pages of the same file.

use std::ffi::CStr;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// `fsopen`'s flag: the filesystem context's descriptor is close-on-exec.
const FSOPEN_CLOEXEC: libc::c_uint = 1;
/// `fsconfig` commands: set a string option; create the superblock.
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
/// `fsmount`'s flag: the mount's descriptor is close-on-exec.
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
/// Mount attributes: no set-uid, no devices, no execution.
const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;
const MOUNT_ATTR_NOEXEC: libc::c_uint = 0x8;
/// Where the kernel says how hard a huge page fault tries.
const DEFRAG: &str = "/sys/kernel/mm/transparent_hugepage/defrag";

/// Why the store's file is not on a huge-page tmpfs.
#[derive(Debug)]
pub(crate) enum Refused {
    /// THP `defrag` is `always`: a huge fault would compact synchronously.
    DefragAlways,
    /// A step of making the mount or the file failed (no `CAP_SYS_ADMIN`,
    /// a kernel before 5.2 or without transparent huge pages).
    Os(&'static str, io::Error),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::DefragAlways => write!(
                f,
                "{DEFRAG} is 'always', so a huge page fault would compact memory on the I/O path"
            ),
            Refused::Os(step, e) => write!(f, "{step}: {e}"),
        }
    }
}

/// A new, empty, nameless file on a private tmpfs mounted `huge=always`.
pub(crate) fn huge_file() -> Result<std::fs::File, Refused> {
    if defrag_is_always(&std::fs::read_to_string(DEFRAG).unwrap_or_default()) {
        return Err(Refused::DefragAlways);
    }
    // SAFETY: a NUL-terminated filesystem name and a valid flag; the
    // result is checked before use.
    let fs = owned(
        unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) },
        "fsopen(tmpfs)",
    )?;
    set(&fs, c"huge", c"always")?;
    set(&fs, c"size", c"0")?;
    // SAFETY: a command without key or value on the context we own.
    let created = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            raw(&fs),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if created < 0 {
        return Err(Refused::Os(
            "creating the tmpfs",
            io::Error::last_os_error(),
        ));
    }
    let attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
    // SAFETY: the context just created; valid flags; checked before use.
    let mnt = owned(
        unsafe { libc::syscall(libc::SYS_fsmount, raw(&fs), FSMOUNT_CLOEXEC, attrs) },
        "fsmount",
    )?;
    // SAFETY: a NUL-terminated relative path under the mount's root
    // descriptor, valid flags and mode; checked before use.
    let file = owned(
        unsafe {
            libc::openat(
                raw(&mnt),
                c".".as_ptr(),
                libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
                0o600,
            )
        }
        .into(),
        "O_TMPFILE on the tmpfs",
    )?;
    Ok(std::fs::File::from(file))
}

/// Bytes of shared memory this process maps with 2 MB pages
/// (`ShmemPmdMapped` in `/proc/self/smaps_rollup`): in a daemon, whose only
/// shared memory is its store, how much of the store is in 2 MB pages.
/// Reading it walks the process's page tables: milliseconds for a store of
/// gigabytes in 4 KB pages, so ask on demand, not per request. 0 if the
/// kernel does not say.
pub fn huge_mapped_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    pmd_mapped_kb(&text) * 1024
}

/// The `ShmemPmdMapped:` figure (kB) of an smaps text, 0 if absent.
fn pmd_mapped_kb(smaps: &str) -> u64 {
    smaps
        .lines()
        .find_map(|l| l.strip_prefix("ShmemPmdMapped:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Whether the `defrag` file's text selects `always`.
fn defrag_is_always(text: &str) -> bool {
    text.split_whitespace().any(|w| w == "[always]")
}

/// Sets a string option of the filesystem context `fs`.
fn set(fs: &OwnedFd, key: &CStr, value: &CStr) -> Result<(), Refused> {
    // SAFETY: NUL-terminated key and value on the context we own.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            raw(fs),
            FSCONFIG_SET_STRING,
            key.as_ptr(),
            value.as_ptr(),
            0,
        )
    };
    if r < 0 {
        return Err(Refused::Os("a tmpfs option", io::Error::last_os_error()));
    }
    Ok(())
}

/// The descriptor a system call returned, owned, or its error.
fn owned(r: libc::c_long, step: &'static str) -> Result<OwnedFd, Refused> {
    let Ok(fd) = i32::try_from(r) else {
        return Err(Refused::Os(step, io::Error::other("no descriptor")));
    };
    if fd < 0 {
        return Err(Refused::Os(step, io::Error::last_os_error()));
    }
    // SAFETY: a descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn raw(fd: &OwnedFd) -> libc::c_int {
    use std::os::fd::AsRawFd;
    fd.as_raw_fd()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defrag_always_is_read_from_the_selected_word() {
        assert!(defrag_is_always(
            "[always] defer defer+madvise madvise never\n"
        ));
        assert!(!defrag_is_always(
            "always defer defer+madvise [madvise] never\n"
        ));
        assert!(!defrag_is_always(""));
    }

    #[test]
    fn pmd_mapped_shared_memory_is_read_from_smaps() {
        let text = "Rss:  100 kB\nShmemPmdMapped:     4096 kB\nFilePmdMapped: 0 kB\n";
        assert_eq!(pmd_mapped_kb(text), 4096);
        assert_eq!(pmd_mapped_kb("Rss: 1 kB\n"), 0);
    }

    #[test]
    fn a_huge_file_is_nameless_and_takes_huge_pages_where_allowed() {
        let file = match huge_file() {
            Ok(f) => f,
            // Not root, no THP, or defrag=always on this machine: nothing
            // to check here; the store falls back to a memfd.
            Err(e) => return eprintln!("skipped: {e}"),
        };
        use std::os::fd::AsRawFd;
        let link = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).unwrap();
        assert!(
            link.to_string_lossy().ends_with("(deleted)"),
            "an O_TMPFILE file has no name: {link:?}"
        );
        file.set_len(4 << 20).unwrap();
        use std::os::unix::fs::FileExt;
        file.write_all_at(&[1u8; 4096], 2 << 20).unwrap();
        assert_eq!(file.read_at(&mut [0u8; 1], 2 << 20).unwrap(), 1);
    }
}
