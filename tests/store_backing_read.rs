//! Reads of written-back pages whose blocks the caller reads itself
//! (`QueueCtx::read_begin` and `read_resume`, what the daemon's queues do
//! through io_uring): each written-back page stops the request for its
//! block; a page written while its block is read comes from RAM; a block
//! that was reused meanwhile is never decoded as the page; a block that
//! cannot be read fails that request alone.

mod common;

use common::{page, real_pages, Content};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use zblk::{
    BackingWait, QueueCtx, ReadStep, Store, StoreConfig, Writeback, WritebackType, PAGE_SIZE,
};

const P: u64 = PAGE_SIZE as u64;

/// A store of `n` pages over a backing file of 64 blocks, every page
/// written (text, and every third one random: stored raw), then written
/// back.
fn written_back(dir: &Path, n: u64) -> (Arc<Store>, QueueCtx, Vec<u8>, PathBuf) {
    let bd = dir.join("backing");
    std::fs::File::create(&bd).unwrap().set_len(64 * P).unwrap();
    let mut cfg = StoreConfig::new(n * P);
    cfg.backing = Some(bd.clone());
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.new_ctx();
    let real = real_pages();
    let data: Vec<u8> = (0..n)
        .flat_map(|i| match i % 3 {
            2 => page(Content::Random(i), &real),
            _ => page(Content::Text(i), &real),
        })
        .collect();
    ctx.write(0, &data).unwrap();
    store.mark_idle(None).unwrap();
    let wb = Writeback {
        select: WritebackType::Idle.into(),
        limit: 0,
    };
    assert_eq!(store.writeback(&wb).unwrap().written, n);
    (store, ctx, data, bd)
}

/// The bytes of `w`'s block, read from the backing file.
fn block_of(bd: &Path, w: &BackingWait) -> Vec<u8> {
    let mut b = vec![0u8; w.bytes()];
    std::fs::File::open(bd)
        .unwrap()
        .read_exact_at(&mut b, w.offset())
        .unwrap();
    b
}

fn waiting(step: ReadStep) -> BackingWait {
    match step {
        ReadStep::Wait(w) => w,
        ReadStep::Done => panic!("the read did not wait for its block"),
    }
}

/// Reads `buf.len()` bytes from page 0, each block it waits for read
/// from `bd`; returns how many it waited for.
fn read_waiting(ctx: &mut QueueCtx, bd: &Path, buf: &mut [u8]) -> usize {
    let mut step = ctx.read_begin(0, buf).unwrap();
    let mut waits = 0;
    while let ReadStep::Wait(w) = step {
        waits += 1;
        let block = block_of(bd, &w);
        step = ctx.read_resume(w, buf, Ok(&block)).unwrap();
    }
    waits
}

#[test]
fn a_read_waits_once_for_each_written_back_page() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut ctx, data, bd) = written_back(dir.path(), 16);
    let mut buf = vec![0u8; data.len()];
    assert_eq!(read_waiting(&mut ctx, &bd, &mut buf), 16);
    assert!(buf == data, "every page read back");
    let c = store.stats().counters;
    assert_eq!((c.bd_reads, c.num_reads, c.failed_reads), (16, 1, 0));
}

#[test]
fn a_page_written_while_its_block_is_read_comes_from_ram() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut ctx, data, bd) = written_back(dir.path(), 4);
    let mut buf = vec![0u8; 2 * PAGE_SIZE];
    let w = waiting(ctx.read_begin(0, &mut buf).unwrap());
    let old = block_of(&bd, &w);
    // Another queue writes page 0 before the block lands.
    let new = page(Content::Text(99), &real_pages());
    store.new_ctx().write(0, &new).unwrap();
    let mut step = ctx.read_resume(w, &mut buf, Ok(&old)).unwrap();
    while let ReadStep::Wait(w) = step {
        let block = block_of(&bd, &w);
        step = ctx.read_resume(w, &mut buf, Ok(&block)).unwrap();
    }
    assert!(
        buf[..PAGE_SIZE] == new[..],
        "the page written, not the old one"
    );
    assert!(buf[PAGE_SIZE..] == data[PAGE_SIZE..2 * PAGE_SIZE]);
}

#[test]
fn a_block_reused_meanwhile_is_read_once_more_and_never_decoded_as_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut ctx, data, bd) = written_back(dir.path(), 4);
    let mut buf = vec![0u8; PAGE_SIZE];
    // Another object's bytes where the page's were: read once more.
    let w = waiting(ctx.read_begin(P, &mut buf).unwrap());
    let reused = vec![0x5a; w.bytes()];
    let w = waiting(ctx.read_resume(w, &mut buf, Ok(&reused)).unwrap());
    let block = block_of(&bd, &w);
    assert!(matches!(
        ctx.read_resume(w, &mut buf, Ok(&block)).unwrap(),
        ReadStep::Done
    ));
    assert!(buf == data[PAGE_SIZE..2 * PAGE_SIZE]);
    // Twice: the block is corrupt, and the request fails with EIO.
    let w = waiting(ctx.read_begin(P, &mut buf).unwrap());
    let w = waiting(ctx.read_resume(w, &mut buf, Ok(&reused)).unwrap());
    let e = ctx.read_resume(w, &mut buf, Ok(&reused)).unwrap_err();
    assert_eq!(e.errno(), -libc::EIO, "{e}");
    assert!(buf.iter().all(|&b| b == 0), "no partly decoded page");
    assert_eq!(store.stats().counters.failed_reads, 1);
}

#[test]
fn a_block_that_cannot_be_read_fails_that_request_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut ctx, data, bd) = written_back(dir.path(), 4);
    let mut buf = vec![0u8; PAGE_SIZE];
    let w = waiting(ctx.read_begin(2 * P, &mut buf).unwrap());
    let dead = std::io::Error::from_raw_os_error(libc::ENOTCONN);
    let e = ctx.read_resume(w, &mut buf, Err(dead)).unwrap_err();
    assert_eq!(e.errno(), -libc::EIO);
    assert!(e.to_string().contains("reading backing block"), "{e}");
    // The same page, read again once the link is back, and its neighbour.
    for p in [2, 3] {
        let w = waiting(ctx.read_begin(p * P, &mut buf).unwrap());
        let block = block_of(&bd, &w);
        ctx.read_resume(w, &mut buf, Ok(&block)).unwrap();
        let at = (p * P) as usize;
        assert!(buf == data[at..at + PAGE_SIZE], "page {p}");
    }
    assert_eq!(store.stats().counters.failed_reads, 1);
}

#[test]
fn pages_in_ram_and_written_back_mix_in_one_request() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, mut ctx, mut data, bd) = written_back(dir.path(), 8);
    // Pages 2 and 5 back in RAM, page 6 same-filled.
    let real = real_pages();
    for (p, c) in [(2, Content::Text(7)), (5, Content::Real(11))] {
        let pg = page(c, &real);
        ctx.write(p * P, &pg).unwrap();
        data[p as usize * PAGE_SIZE..(p as usize + 1) * PAGE_SIZE].copy_from_slice(&pg);
    }
    let same = vec![0x11u8; PAGE_SIZE];
    ctx.write(6 * P, &same).unwrap();
    data[6 * PAGE_SIZE..7 * PAGE_SIZE].copy_from_slice(&same);
    let mut buf = vec![0u8; data.len()];
    let waits = read_waiting(&mut ctx, &bd, &mut buf);
    assert_eq!(waits, 5, "only the pages still written back wait");
    assert!(buf == data);
}
