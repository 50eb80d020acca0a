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
//! Nothing here allocates once the queue serves: each tag has its own
//! aligned block, made, locked and touched with the queue
//! ([`BlockBufs`]), which lives in the queue's shared state, so a read
//! still in flight when the queue thread ends never lands in freed
//! memory; the waits are a table by tag, made before the first request.

use libublk::helpers::IoBuf;
use libublk::io::{UblkIOCtx, UblkQueue};
use std::os::fd::{AsRawFd, RawFd};
use zblk::{BackingWait, Store, PAGE_SIZE};

/// io_uring op tag of a read of a backing block (any value ublk commands
/// do not use in the target-I/O space, and not the tick's).
pub const BACKING_OP: u32 = 0xfd;

/// One aligned block per tag, for the reads of written-back pages.
pub struct BlockBufs {
    buf: IoBuf<u8>,
    tags: usize,
}

impl BlockBufs {
    /// Blocks for `tags` tags, locked and touched, so that a swap-in
    /// never faults one in.
    pub fn new(tags: u16) -> Self {
        let tags = usize::from(tags.max(1));
        let mut buf = IoBuf::<u8>::new(tags * PAGE_SIZE);
        if !buf.mlock() {
            log::warn!(
                "backing read blocks could not be locked: {}",
                std::io::Error::last_os_error()
            );
        }
        buf.zero_buf();
        BlockBufs { buf, tags }
    }

    /// Where tag `tag`'s block is, for the kernel to read into.
    fn at(&self, tag: u16) -> Option<*mut u8> {
        let t = usize::from(tag);
        // SAFETY: `t * PAGE_SIZE` is within the buffer (t < tags).
        (t < self.tags).then(|| unsafe { self.buf.as_mut_ptr().add(t * PAGE_SIZE) })
    }

    /// The first `len` bytes of tag `tag`'s block.
    fn bytes(&self, tag: u16, len: usize) -> Option<&[u8]> {
        let at = usize::from(tag) * PAGE_SIZE;
        self.buf.as_slice().get(at..at + len.min(PAGE_SIZE))
    }
}

/// A queue's backing reads: the file they read, the blocks, and which
/// tags wait for one.
pub struct BackingReads<'a> {
    fd: Option<RawFd>,
    blocks: Option<&'a BlockBufs>,
    waits: Vec<Option<BackingWait>>,
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
        BackingReads { fd, blocks, waits }
    }

    /// Queues the read of `w`'s block for tag `tag` on `q`'s ring; gives
    /// `w` back with the reason when it cannot.
    pub fn submit(
        &mut self,
        q: &UblkQueue,
        tag: u16,
        w: BackingWait,
    ) -> Result<(), (BackingWait, std::io::Error)> {
        let unable = |why: &str| std::io::Error::other(why.to_string());
        let (Some(fd), Some(blocks)) = (self.fd, self.blocks) else {
            return Err((w, unable("this queue has no backing read blocks")));
        };
        let (Some(dst), Some(slot)) = (blocks.at(tag), self.waits.get_mut(usize::from(tag))) else {
            return Err((w, unable("tag out of range")));
        };
        let len = w.bytes().min(PAGE_SIZE) as u32;
        let sqe = io_uring::opcode::Read::new(io_uring::types::Fd(fd), dst, len)
            .offset(w.offset())
            .build()
            .user_data(UblkIOCtx::build_user_data(tag, BACKING_OP, 0, true));
        // The block and the file outlive the read: the blocks live in the
        // queue's shared state, the file in the store this queue holds.
        match q.ublk_submit_sqe_sync(sqe) {
            Ok(()) => {
                *slot = Some(w);
                Ok(())
            }
            Err(e) => Err((w, unable(&format!("cannot queue the read: {e:?}")))),
        }
    }

    /// The read of tag `tag` landed with `res` (bytes read, or a negative
    /// errno): the wait it was for, and the block's bytes or the error;
    /// `None` if the tag had no read out.
    pub fn landed(
        &mut self,
        tag: u16,
        res: i32,
    ) -> Option<(BackingWait, std::io::Result<&'a [u8]>)> {
        let w = self.waits.get_mut(usize::from(tag))?.take()?;
        let bytes = match usize::try_from(res) {
            Ok(n) => self
                .blocks
                .and_then(|b| b.bytes(tag, n))
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
