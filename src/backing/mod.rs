//! The backing store: a block device or regular file that written-back
//! pages' compressed objects live in (zram's `backing_dev`).
//!
//! The file is cut into 4 KB blocks and opened `O_DIRECT` (the page cache
//! would only hold a second copy of what swap just pushed out of RAM); a
//! file system that refuses `O_DIRECT` (tmpfs) gets buffered I/O, with a
//! log line. Writeback (`crate::writeback`) packs many compressed objects
//! into each block and writes whole runs of blocks with one `pwrite`; a
//! read of a written-back page reads its one block (a packed group's
//! blocks) with one `pread`, or its caller reads it (the daemon, through
//! its queue's io_uring). The free map (`map`) counts the live pages each
//! block holds; the buffers the I/O needs are made here, when the store
//! is built (`buf`).

mod buf;
mod map;

pub(crate) use buf::AlignedBuf;

use crate::error::{Error, Result};
use crate::page::{PAGE_SIZE, PAGE_SIZE_U64};
use map::FreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Blocks one writeback batch gathers before it writes them (one `pwrite`
/// of up to 256 KB when the free blocks it gets are contiguous).
pub(crate) const BATCH_BLOCKS: usize = 64;

/// Objects one batch holds at most: the smallest compressed object is a
/// few bytes, so cap what the preallocated list must hold.
pub(crate) const BATCH_OBJECTS: usize = BATCH_BLOCKS * 64;

/// Where a written-back object lies: `len` bytes from byte `off` of
/// block `block`, on as many blocks as that takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extent {
    /// Its first block.
    pub(crate) block: u32,
    /// Its offset in that block.
    pub(crate) off: usize,
    /// Its length.
    pub(crate) len: usize,
}

impl Extent {
    /// The blocks it touches.
    pub(crate) fn blocks(&self) -> std::ops::Range<u32> {
        let n = (self.off + self.len).div_ceil(PAGE_SIZE) as u32;
        self.block..self.block.saturating_add(n)
    }
}

/// A batch block no file block was reserved for.
pub(crate) const NO_BLOCK: u32 = u32::MAX;

/// Bytes of backing store needed at least: one block.
pub(crate) const MIN_BYTES: u64 = PAGE_SIZE_U64;

/// An object waiting in a writeback batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    /// Its page.
    pub(crate) page: u64,
    /// The slot's entry when it was copied: the switch happens only if the
    /// slot still holds this object.
    pub(crate) entry: crate::slot::Entry,
    /// Its block within the batch.
    pub(crate) blk: usize,
    /// Its offset in that block.
    pub(crate) off: u16,
    /// Bytes it takes from there: a per-page object's length, or a packed
    /// group's header and blob (which may cross blocks).
    pub(crate) bytes: u32,
    /// A packed group's page: its object's id, and its position in the
    /// blob (`None`: a per-page object).
    pub(crate) group: Option<(u64, u8)>,
    /// A packed group's CRC-32 (its header holds it too).
    pub(crate) crc: u32,
}

impl Pending {
    /// The batch blocks it touches.
    pub(crate) fn blks(&self) -> std::ops::Range<usize> {
        let at = Extent {
            block: self.blk as u32,
            off: usize::from(self.off),
            len: self.bytes as usize,
        };
        let b = at.blocks();
        b.start as usize..b.end as usize
    }
}

/// What a writeback batch is built in: made once with the store, reused.
pub(crate) struct Batch {
    /// `BATCH_BLOCKS` blocks of objects, packed.
    pub(crate) buf: AlignedBuf,
    /// The objects in `buf`, in order.
    pub(crate) items: Vec<Pending>,
    /// Per batch block: the file block reserved for it ([`NO_BLOCK`]:
    /// none, its pages stay in RAM).
    pub(crate) blocks: Vec<u32>,
}

/// An open backing store and its free map.
pub(crate) struct Backing {
    file: File,
    path: PathBuf,
    /// Whether the file is open `O_DIRECT`.
    direct: bool,
    map: FreeMap,
    /// The writeback thread's batch (one writeback at a time).
    pub(crate) batch: Mutex<Batch>,
}

impl Backing {
    /// Opens `path` (a block device or a regular file of at least
    /// [`MIN_BYTES`]) and makes the writeback buffers, mlocked if `mlock`.
    pub(crate) fn open(path: &Path, mlock: bool) -> Result<Backing> {
        let shown = path.display();
        let bad = |what: String| Error::InvalidConfig(format!("backing device {shown}: {what}"));
        let (mut file, mut direct) = match open_file(path, true) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                log::info!("backing device {shown} refuses O_DIRECT: buffered I/O");
                (
                    open_file(path, false).map_err(|e| bad(format!("cannot open: {e}")))?,
                    false,
                )
            }
            Err(e) => return Err(bad(format!("cannot open: {e}"))),
        };
        let bytes = file
            .seek(SeekFrom::End(0))
            .map_err(|e| bad(format!("cannot size: {e}")))?;
        if bytes < MIN_BYTES {
            return Err(bad(format!(
                "too small: {bytes} bytes, at least {MIN_BYTES} needed"
            )));
        }
        let mut probe = AlignedBuf::new(1, false)?;
        if direct {
            if let Err(e) = file.read_at(probe.as_mut_slice(), 0) {
                if e.raw_os_error() != Some(libc::EINVAL) {
                    return Err(bad(format!("cannot read: {e}")));
                }
                log::info!("backing device {shown} refuses O_DIRECT reads: buffered I/O");
                file = open_file(path, false).map_err(|e| bad(format!("cannot open: {e}")))?;
                direct = false;
            }
        }
        let blocks = (bytes / PAGE_SIZE_U64).min(u64::from(u32::MAX)) as u32;
        let batch = Batch {
            buf: AlignedBuf::new(BATCH_BLOCKS, mlock)?,
            items: Vec::with_capacity(BATCH_OBJECTS),
            blocks: Vec::with_capacity(BATCH_BLOCKS),
        };
        Ok(Backing {
            file,
            path: path.to_path_buf(),
            direct,
            map: FreeMap::new(blocks),
            batch: Mutex::new(batch),
        })
    }

    /// The path it was opened from.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether I/O bypasses the page cache.
    pub(crate) fn is_direct(&self) -> bool {
        self.direct
    }

    /// Bytes of backing store (whole blocks).
    pub(crate) fn size(&self) -> u64 {
        u64::from(self.map.blocks()) * PAGE_SIZE_U64
    }

    /// Bytes of blocks holding at least one object.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.map.used() * PAGE_SIZE_U64
    }

    /// Reserves a run of contiguous free blocks, block `i` for `counts[i]`
    /// live pages; returns its first block (`None`: no such run).
    pub(crate) fn reserve_run(&self, counts: &[u16]) -> Option<u32> {
        self.map.reserve_run(counts)
    }

    /// One object of `block` is gone.
    pub(crate) fn release(&self, block: u32) {
        if !self.map.release(block) {
            log::error!("backing block {block} released with no object in it");
        }
    }

    /// One live page of an object on blocks `blocks` is gone.
    pub(crate) fn release_blocks(&self, blocks: std::ops::Range<u32>) {
        for b in blocks {
            self.release(b);
        }
    }

    /// Recovery: an object lives in `block`; false if that cannot be.
    pub(crate) fn claim(&self, block: u32) -> bool {
        self.map.claim(block)
    }

    /// Whether `block` is one of the store's.
    pub(crate) fn has_block(&self, block: u32) -> bool {
        block < self.map.blocks()
    }

    /// The file, for a caller reading blocks itself.
    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.file.as_fd()
    }

    /// Reads blocks `blocks` into the front of `buf` (aligned, one `pread`
    /// unless the kernel returns less); a short read (the file was
    /// truncated) or a buffer too small is an error.
    pub(crate) fn read_blocks(
        &self,
        blocks: std::ops::Range<u32>,
        buf: &mut AlignedBuf,
    ) -> std::result::Result<(), String> {
        let block = blocks.start;
        let len = blocks.len() * PAGE_SIZE;
        let Some(dst) = buf.as_mut_slice().get_mut(..len) else {
            return Err(format!(
                "{} backing blocks do not fit this queue's read buffer",
                blocks.len()
            ));
        };
        let at = u64::from(block) * PAGE_SIZE_U64;
        let mut done = 0;
        while done < len {
            match self.file.read_at(&mut dst[done..], at + done as u64) {
                Ok(0) => return Err(format!("backing block {block} is past the end of the file")),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading backing block {block}: {e}")),
            }
        }
        Ok(())
    }

    /// Writes `data` (whole blocks) from block `first` on.
    pub(crate) fn write_blocks(&self, first: u32, data: &[u8]) -> std::io::Result<()> {
        self.file
            .write_all_at(data, u64::from(first) * PAGE_SIZE_U64)
    }
}

/// The CRC-32 a written-back object is checked with: of its page number
/// (so that another page's object in its place fails too) and its bytes.
pub(crate) fn object_crc(page: u64, obj: &[u8]) -> u32 {
    let mut c = libdeflater::Crc::new();
    c.update(&page.to_le_bytes());
    c.update(obj);
    c.sum()
}

/// Opens `path` for reading and writing, `O_DIRECT` if `direct`.
fn open_file(path: &Path, direct: bool) -> std::io::Result<File> {
    let flags = if direct { libc::O_DIRECT } else { 0 };
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags | libc::O_CLOEXEC)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(bytes: u64) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bd");
        File::create(&p).unwrap().set_len(bytes).unwrap();
        (dir, p)
    }

    #[test]
    fn opens_a_file_and_round_trips_blocks() {
        let (_d, p) = file_of(8 * PAGE_SIZE_U64);
        let b = Backing::open(&p, false).unwrap();
        assert_eq!(b.size(), 8 * PAGE_SIZE_U64);
        let mut data = vec![0u8; 2 * PAGE_SIZE];
        data[PAGE_SIZE + 9] = 0xab;
        let mut src = AlignedBuf::new(2, false).unwrap();
        src.as_mut_slice().copy_from_slice(&data);
        b.write_blocks(3, src.as_slice()).unwrap();
        let mut out = AlignedBuf::new(2, false).unwrap();
        b.read_blocks(4..5, &mut out).unwrap();
        assert_eq!(out.as_slice()[9], 0xab);
        b.read_blocks(3..5, &mut out).unwrap();
        assert_eq!(out.as_slice()[PAGE_SIZE + 9], 0xab);
        assert!(b.read_blocks(8..9, &mut out).is_err(), "past the end");
        assert!(
            b.read_blocks(0..3, &mut out).is_err(),
            "bigger than the buffer"
        );
    }

    #[test]
    fn refuses_missing_and_too_small_files_in_one_line() {
        let (_d, p) = file_of(100);
        let e = Backing::open(&p, false).err().unwrap().to_string();
        assert!(e.contains("too small") && !e.contains('\n'), "{e}");
        let e = Backing::open(Path::new("/nonexistent/bd"), false)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("cannot open"), "{e}");
    }
}
