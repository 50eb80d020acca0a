//! Helpers the unit tests share: a backing file, pages that compress to
//! more than a block a group, and a store whose pages are written back.

use std::path::PathBuf;
use std::sync::Arc;
use zblk::{Mode, Store, StoreConfig, PAGE_SIZE};

/// A sparse backing file of `bytes` in a new temporary folder (removed
/// when the returned folder is dropped).
pub fn backing_file(bytes: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let bd = dir.path().join("backing");
    std::fs::File::create(&bd)
        .and_then(|f| f.set_len(bytes))
        .expect("a backing file");
    (dir, bd)
}

/// `n` pages, each a quarter of noise and the rest a pattern of its own:
/// a group of 8 compresses to more than a block, so its run spans blocks.
pub fn noisy_pages(n: usize) -> Vec<u8> {
    let mut x = 0x2545_f491u32;
    let mut data = vec![0u8; n * PAGE_SIZE];
    for (p, page) in data.chunks_mut(PAGE_SIZE).enumerate() {
        let seed = p as u8 + 1;
        for (i, b) in page.iter_mut().enumerate() {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *b = if i < PAGE_SIZE / 4 {
                x as u8
            } else {
                (i as u8).wrapping_mul(seed) ^ seed
            };
        }
    }
    data
}

/// A store of `size` bytes in `mode` over a new 1 MB backing file, `data`
/// written at its start, marked idle and written back.
pub struct WrittenBack {
    /// The backing file's folder, kept while the store lives.
    pub _dir: tempfile::TempDir,
    /// The backing file.
    pub file: PathBuf,
    /// The store.
    pub store: Arc<Store>,
    /// Pages the writeback wrote.
    pub written: u64,
}

impl WrittenBack {
    /// Makes it.
    pub fn new(size: u64, mode: Mode, data: &[u8]) -> Self {
        let (dir, file) = backing_file(1 << 20);
        let mut cfg = StoreConfig::new(size);
        cfg.backing = Some(file.clone());
        cfg.mode = mode;
        let store = Store::new(cfg).expect("a store");
        store.new_ctx().write(0, data).expect("the pages written");
        store.mark_idle(None).expect("marked idle");
        let wb = zblk::Writeback {
            select: zblk::WritebackType::Idle.into(),
            limit: 0,
        };
        let written = store.writeback(&wb).expect("written back").written;
        WrittenBack {
            _dir: dir,
            file,
            store,
            written,
        }
    }
}
