//! Reads of written-back pages' blocks through the queue's own io_uring.
//!
//! A read request that reaches a written-back page waits for that page's
//! block ([`zblk::BackingWait`]); the queue does not read it itself (a
//! `pread` on a slow or dead link, an NVMe/TCP or NBD backing device,
//! would hold up every request of the queue) but queues an `IORING_OP_READ`
//! on the ring it already waits on, tagged with the request's tag, and
//! serves other requests meanwhile. When the read lands the request goes
//! on ([`crate::io::resume`]) and is completed, or waits for its next
//! written-back page.
//!
//! A page of a written-back packed group needs its group's run of blocks
//! (up to its pages and two): a queue keeps [`GROUP_BUFS`] buffers of
//! that size for them, and a read that finds them all taken is read on the
//! queue thread with `pread` ([`Unqueued::Busy`]), so a queue never holds
//! more than [`GROUP_BUFS`] runs locked for reads; a group read beyond
//! those holds up its queue until it lands.
//!
//! Nothing here allocates once the queue serves: each tag has its own
//! aligned block and the queue its group buffers, made, locked and
//! touched with the queue ([`BlockBufs`]), which live in the queue's
//! shared state, so a read still in flight when the queue thread ends
//! never lands in freed memory; the waits are a table by tag, made before
//! the first request.

use libublk::helpers::IoBuf;
use libublk::io::{UblkIOCtx, UblkQueue};
use std::os::fd::{AsRawFd, RawFd};
use zblk::{BackingWait, Store, PAGE_SIZE};

/// io_uring op tag of a read of a backing block (any value ublk commands
/// do not use in the target-I/O space, and not the tick's).
pub const BACKING_OP: u32 = 0xfd;

/// Buffers a queue keeps for reads of written-back packed groups in
/// flight at once.
pub const GROUP_BUFS: usize = 4;

/// One aligned block per tag, for the reads of written-back pages, and
/// [`GROUP_BUFS`] runs for those of written-back groups.
pub struct BlockBufs {
    buf: IoBuf<u8>,
    tags: usize,
    /// The group buffers, one after the other (`None` in per-page mode).
    groups: Option<IoBuf<u8>>,
    /// Bytes of each.
    group_bytes: usize,
}

impl BlockBufs {
    /// Blocks for `tags` tags, and group buffers of `read_bytes` each
    /// when that is more than a block (the store's
    /// [`Store::backing_read_bytes`]), locked and touched, so that a
    /// swap-in never faults one in.
    pub fn new(tags: u16, read_bytes: usize) -> Self {
        let tags = usize::from(tags.max(1));
        let groups = (read_bytes > PAGE_SIZE).then(|| locked(GROUP_BUFS * read_bytes));
        BlockBufs {
            buf: locked(tags * PAGE_SIZE),
            tags,
            groups,
            group_bytes: read_bytes,
        }
    }

    /// Where the read into `dst` goes, for the kernel to read into.
    fn at(&self, dst: Dst) -> Option<*mut u8> {
        let (buf, at) = self.place(dst)?;
        // SAFETY: `at` is within the buffer (`place` checked it).
        Some(unsafe { buf.as_mut_ptr().add(at) })
    }

    /// The first `len` bytes of `dst`.
    fn bytes(&self, dst: Dst, len: usize) -> Option<&[u8]> {
        let (buf, at) = self.place(dst)?;
        buf.as_slice().get(at..at + len.min(self.size(dst)))
    }

    /// The buffer `dst` is in and its offset there, if it exists.
    fn place(&self, dst: Dst) -> Option<(&IoBuf<u8>, usize)> {
        match dst {
            Dst::Tag(t) => {
                (usize::from(t) < self.tags).then_some((&self.buf, usize::from(t) * PAGE_SIZE))
            }
            Dst::Group(g) => match &self.groups {
                Some(b) if g < GROUP_BUFS => Some((b, g * self.group_bytes)),
                _ => None,
            },
        }
    }

    /// Bytes `dst` holds.
    fn size(&self, dst: Dst) -> usize {
        match dst {
            Dst::Tag(_) => PAGE_SIZE,
            Dst::Group(_) => self.group_bytes,
        }
    }
}

/// An aligned buffer of `bytes`, locked (or logged) and touched.
fn locked(bytes: usize) -> IoBuf<u8> {
    let mut buf = IoBuf::<u8>::new(bytes);
    if !buf.mlock() {
        log::warn!(
            "backing read blocks could not be locked: {}",
            std::io::Error::last_os_error()
        );
    }
    buf.zero_buf();
    buf
}

/// Where a backing read lands: its tag's block, or a group buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dst {
    Tag(u16),
    Group(usize),
}

/// Why a read was not queued; the wait comes back with it.
#[derive(Debug)]
pub enum Unqueued {
    /// Every group buffer is taken: read it on this thread.
    Busy(BackingWait),
    /// It cannot be read at all (no backing store, a full ring): fail the
    /// request.
    Failed(BackingWait, std::io::Error),
}

/// A queue's backing reads: the file they read, the blocks, which tags
/// wait for one and where each will land, and which group buffer each
/// tag holds.
pub struct BackingReads<'a> {
    fd: Option<RawFd>,
    blocks: Option<&'a BlockBufs>,
    waits: Vec<Option<(BackingWait, Dst)>>,
    /// The tag each group buffer is lent to.
    group_tags: [Option<u16>; GROUP_BUFS],
}

impl<'a> BackingReads<'a> {
    /// The reads of a queue serving `store` with `depth` tags into
    /// `blocks` (`None`, or a store without a backing device: a request
    /// that waits for a block fails with EIO, which cannot happen).
    pub fn new(store: &Store, blocks: Option<&'a BlockBufs>, depth: u16) -> Self {
        let fd = store.backing_fd().map(|f| f.as_raw_fd());
        let waits = if fd.is_some() && blocks.is_some() {
            vec![None; usize::from(depth)]
        } else {
            Vec::new()
        };
        BackingReads {
            fd,
            blocks,
            waits,
            group_tags: [None; GROUP_BUFS],
        }
    }

    /// Queues the read of `w`'s blocks for tag `tag` on `q`'s ring; gives
    /// `w` back with the reason when it cannot.
    pub fn submit(&mut self, q: &UblkQueue, tag: u16, w: BackingWait) -> Result<(), Unqueued> {
        let unable = |why: &str| std::io::Error::other(why.to_string());
        let (Some(fd), Some(blocks)) = (self.fd, self.blocks) else {
            return Err(Unqueued::Failed(
                w,
                unable("this queue has no backing read blocks"),
            ));
        };
        let dst = match self.dst(blocks, tag, w.bytes()) {
            Ok(dst) => dst,
            Err(None) => return Err(Unqueued::Busy(w)),
            Err(Some(why)) => return Err(Unqueued::Failed(w, unable(why))),
        };
        let Some(at) = blocks.at(dst) else {
            return Err(Unqueued::Failed(w, unable("no buffer for this read")));
        };
        let sqe = io_uring::opcode::Read::new(io_uring::types::Fd(fd), at, w.bytes() as u32)
            .offset(w.offset())
            .build()
            .user_data(UblkIOCtx::build_user_data(tag, BACKING_OP, 0, true));
        // The buffer and the file outlive the read: the buffers live in the
        // queue's shared state, the file in the store this queue holds.
        match q.ublk_submit_sqe_sync(sqe) {
            Ok(()) => {
                self.waits[usize::from(tag)] = Some((w, dst));
                if let Dst::Group(g) = dst {
                    self.group_tags[g] = Some(tag);
                }
                Ok(())
            }
            Err(e) => Err(Unqueued::Failed(
                w,
                unable(&format!("cannot queue the read: {e:?}")),
            )),
        }
    }

    /// Where a read of `bytes` for tag `tag` lands in `blocks`: its tag's
    /// block for one block, a free group buffer for more; `Err(None)` when
    /// every group buffer is lent, `Err(Some(why))` when it cannot be read.
    fn dst(&self, blocks: &BlockBufs, tag: u16, bytes: usize) -> Result<Dst, Option<&'static str>> {
        if usize::from(tag) >= self.waits.len() {
            return Err(Some("tag out of range"));
        }
        if bytes <= PAGE_SIZE {
            return Ok(Dst::Tag(tag));
        }
        if blocks.groups.is_none() || bytes > blocks.group_bytes {
            return Err(Some("a read larger than its buffer"));
        }
        let free = self.group_tags.iter().position(Option::is_none);
        free.map(Dst::Group).ok_or(None)
    }

    /// The read of tag `tag` landed with `res` (bytes read, or a negative
    /// errno): the wait it was for, and the blocks' bytes or the error;
    /// `None` if the tag had no read out. A group buffer it held is free
    /// again: the caller is done with the bytes before it queues another
    /// read.
    pub fn landed(
        &mut self,
        tag: u16,
        res: i32,
    ) -> Option<(BackingWait, std::io::Result<&'a [u8]>)> {
        let (w, dst) = self.waits.get_mut(usize::from(tag))?.take()?;
        if let Dst::Group(g) = dst {
            self.group_tags[g] = None;
        }
        let bytes = match usize::try_from(res) {
            Ok(n) => self
                .blocks
                .and_then(|b| b.bytes(dst, n))
                .ok_or_else(|| std::io::Error::other("no block for this tag")),
            Err(_) => Err(std::io::Error::from_raw_os_error(-res)),
        };
        Some((w, bytes))
    }

    /// Reads out now.
    pub fn in_flight(&self) -> usize {
        self.waits.iter().filter(|w| w.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads of a queue of 4 tags over `blocks`, as if it had a backing
    /// file (no read is queued here).
    fn reads(blocks: &BlockBufs) -> BackingReads<'_> {
        BackingReads {
            fd: None,
            blocks: Some(blocks),
            waits: vec![None; 4],
            group_tags: [None; GROUP_BUFS],
        }
    }

    #[test]
    fn a_block_lands_in_its_tag_and_a_run_in_a_free_group_buffer() {
        let blocks = BlockBufs::new(4, 3 * PAGE_SIZE);
        let mut r = reads(&blocks);
        assert_eq!(r.dst(&blocks, 2, PAGE_SIZE), Ok(Dst::Tag(2)));
        assert_eq!(r.dst(&blocks, 2, 3 * PAGE_SIZE), Ok(Dst::Group(0)));
        r.group_tags[0] = Some(2);
        assert_eq!(r.dst(&blocks, 3, 2 * PAGE_SIZE), Ok(Dst::Group(1)));
        for g in 1..GROUP_BUFS {
            r.group_tags[g] = Some(3);
        }
        assert_eq!(
            r.dst(&blocks, 1, 2 * PAGE_SIZE),
            Err(None),
            "all lent: busy"
        );
        assert_eq!(r.dst(&blocks, 1, PAGE_SIZE), Ok(Dst::Tag(1)));
        assert!(r.dst(&blocks, 1, 4 * PAGE_SIZE).unwrap_err().is_some());
        assert!(r.dst(&blocks, 4, PAGE_SIZE).unwrap_err().is_some());
        // Per-page mode has no group buffers: a run cannot be read.
        let single = BlockBufs::new(4, PAGE_SIZE);
        assert!(reads(&single)
            .dst(&single, 0, 2 * PAGE_SIZE)
            .unwrap_err()
            .is_some());
    }

    /// A read of a written-back packed group's page, waiting for its run
    /// (the store and its backing file kept alive with it).
    fn group_wait() -> (BackingWait, crate::testing::WrittenBack) {
        let data = crate::testing::noisy_pages(8);
        let wb = crate::testing::WrittenBack::new(64 * PAGE_SIZE as u64, zblk::Mode::Packed, &data);
        assert_eq!(wb.written, 8);
        let s = &wb.store;
        let mut buf = vec![0u8; PAGE_SIZE];
        let zblk::ReadStep::Wait(w) = s.new_ctx().read_begin(0, &mut buf).unwrap() else {
            panic!("the read did not wait for the group's blocks");
        };
        (w, wb)
    }

    #[test]
    fn a_landed_group_read_gives_its_buffer_back() {
        let (w, wb) = group_wait();
        let s = &wb.store;
        assert!(w.bytes() > PAGE_SIZE, "the group spans blocks");
        let blocks = BlockBufs::new(4, s.backing_read_bytes());
        let mut r = reads(&blocks);
        r.waits[1] = Some((w, Dst::Group(2)));
        r.group_tags[2] = Some(1);
        let (back, bytes) = r.landed(1, w.bytes() as i32).unwrap();
        assert_eq!((back, bytes.unwrap().len()), (w, w.bytes()));
        assert_eq!(r.group_tags[2], None, "the buffer is free again");
        assert!(r.landed(1, 0).is_none(), "no read out for the tag now");
        r.waits[3] = Some((w, Dst::Group(0)));
        r.group_tags[0] = Some(3);
        let (_, failed) = r.landed(3, -libc::ENOTCONN).unwrap();
        assert_eq!(failed.unwrap_err().raw_os_error(), Some(libc::ENOTCONN));
        assert_eq!(r.group_tags[0], None, "a failed read frees its buffer too");
    }
}
