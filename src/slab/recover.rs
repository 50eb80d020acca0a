//! Rebuilding a slab over the zspages a dead process left in shared memory.
//!
//! A slab's bookkeeping (owner tables, free lists, fullness groups, spares,
//! memory charged) is process memory and died with the process; its
//! zspages' bytes did not. The store's recovery scan walks the slot table
//! and [`SlabAllocator::claim`]s every handle a slot references: that
//! object is live, with that owner. [`SlabAllocator::finish_recovery`] then
//! makes everything unclaimed free space (free lists, free ids) and gives
//! back the pages of every zspage nothing was claimed in: objects that sat
//! in a free batch or the drain queue at the crash, spares, emptied
//! zspages. Nothing leaks, and nothing claimed can be handed out again.

use super::{group_of, lock, unpack, SlabAllocator, ZsMeta, FREE, NIL};
use crate::alloc::Handle;

/// What claiming a handle found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The object was not claimed before: it is now live, for this owner.
    First,
    /// Another slot claimed it already (the pages of one packed group).
    Again,
    /// The handle cannot name an object of that size in this slab: the
    /// slot that holds it is corrupt.
    Invalid,
}

impl SlabAllocator {
    /// During a recovery scan: marks object `h` of `len` bytes live, owned
    /// by slot `owner` if nobody claimed it before.
    pub(crate) fn claim(&self, h: Handle, len: usize, owner: u64) -> Claim {
        let (c, id, idx) = unpack(h);
        let Some(class) = self.classes.get(c) else {
            return Claim::Invalid;
        };
        // The smallest class for `len`, or a larger one (the reserve's
        // fallback places objects there when their own class is empty).
        let fits = len > 0
            && len <= u32::MAX as usize
            && super::reserve::fallback_fits(class.spec.size, len as u32)
            && idx < class.spec.objs;
        if !fits || id >= class.id_limit() {
            return Claim::Invalid;
        }
        let mut state = lock(class);
        if !class.dir.ensure(id) {
            return Claim::Invalid;
        }
        if state.zs.len() <= id as usize {
            state.zs.resize_with(id as usize + 1, ZsMeta::dead);
        }
        let z = &mut state.zs[id as usize];
        if !z.is_live() {
            // Every object free until claimed; free lists come at the end.
            z.owners = vec![FREE | NIL as u64; class.spec.objs as usize].into_boxed_slice();
            z.free_head = NIL;
        }
        if z.owners[idx as usize] & FREE == 0 {
            return Claim::Again;
        }
        z.owners[idx as usize] = owner & !FREE;
        z.inuse += 1;
        state.objs_used += 1;
        Claim::First
    }

    /// Ends a recovery scan: threads the free objects of every claimed
    /// zspage into its free list, files it in its fullness group, locks it
    /// if the slab locks memory, charges it, and gives back the pages of
    /// every zspage of the class's region that holds no claimed object.
    pub(crate) fn finish_recovery(&self) {
        for class in self.classes.iter() {
            let mut state = lock(class);
            let objs = class.spec.objs;
            let mut live = 0;
            for id in 0..state.zs.len() as u64 {
                if !state.zs[id as usize].is_live() {
                    super::reserve::push_touched(&mut state.free_ids, id);
                    continue;
                }
                let z = &mut state.zs[id as usize];
                let mut head = NIL;
                for idx in (0..objs).rev() {
                    if z.owners[idx as usize] & FREE != 0 {
                        z.owners[idx as usize] = FREE | head as u64;
                        head = idx;
                    }
                }
                z.free_head = head;
                let g = group_of(z.inuse, objs);
                state.link(id, g);
                state.live_zspages += 1;
                live += 1;
                if self.mlock {
                    // Locks it (its pages are in the file already, so
                    // populating only maps them). Its result is ignored:
                    // the zspage is live whatever happens, and a refused
                    // lock leaves it unlocked, as a failed mlock did.
                    self.back(class, id);
                }
            }
            // The unclaimed zspages among the claimed ones (free ids, in
            // ascending order), and all beyond the last: pending frees,
            // spares, emptied zspages.
            self.release_runs(class, &state.free_ids);
            class.dir.release_from(state.zs.len() as u64);
            // Recovery runs before any limit is set: this cannot be refused.
            let _ = self.mem.try_charge(class.cost * live);
        }
    }
}
