//! Freeing detached objects: the per-queue batch of handles.
//!
//! Discard, write-zeroes and overwrites detach handles from slots and hand
//! them to the queue's [`FreeBatch`] with no lock and no atomic. A full batch
//! (64 handles, as in the zsmalloc deferred-free patch) is freed in one
//! `free_bulk` call.

use crate::alloc::{Handle, ObjAllocator};

/// Handles per batch, as in the zsmalloc deferred-free patch.
pub const FREE_BATCH: usize = 64;

/// A queue's batch of detached handles waiting to be freed.
#[derive(Debug, Default)]
pub struct FreeBatch {
    handles: Vec<Handle>,
}

impl FreeBatch {
    /// Creates an empty batch.
    pub fn new() -> Self {
        FreeBatch {
            handles: Vec::with_capacity(FREE_BATCH),
        }
    }

    /// Adds a detached handle; frees the batch when it is full.
    #[inline]
    pub fn push(&mut self, h: Handle, alloc: &dyn ObjAllocator) {
        self.handles.push(h);
        if self.handles.len() >= FREE_BATCH {
            self.flush(alloc);
        }
    }

    /// Frees every handle in the batch now.
    pub fn flush(&mut self, alloc: &dyn ObjAllocator) {
        if !self.handles.is_empty() {
            alloc.free_bulk(&self.handles);
            self.handles.clear();
        }
    }

    /// Handles waiting in this batch.
    pub fn pending(&self) -> usize {
        self.handles.len()
    }
}
