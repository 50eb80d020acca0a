//! Compaction: moving objects out of the emptiest zspages into the fullest
//! so that the emptied zspages go back to the OS.
//!
//! Work is bounded per step: one source zspage per class-lock hold, then the
//! lock is released so that allocations and frees of the class get in
//! between. Each move runs under the owner slot's lock (through
//! [`Relocate`]): the slot is checked to still reference the object, the
//! bytes are copied into a free object of the destination zspage, and the
//! slot takes the new handle before anyone can read it. An object whose slot
//! no longer references it is detached and waiting to be freed; it is left
//! where it is.

use super::{unpack, ClassState, SizeClass, SlabAllocator, FREE};
use crate::alloc::{Handle, Relocate};

impl SlabAllocator {
    /// Compacts class `c` for at most `max_steps` steps (one source zspage
    /// each); returns the pages given back.
    pub fn compact_class(&self, c: usize, relocate: &dyn Relocate, max_steps: usize) -> u64 {
        let Some(class) = self.classes.get(c) else {
            return 0;
        };
        // Compaction is there to give memory back: spares go first.
        let mut freed = self.trim_spares(class);
        // Zspages whose remaining objects are all waiting to be freed: they
        // cannot be emptied now, so later steps look past them.
        let mut pinned: Vec<u64> = Vec::new();
        for _ in 0..max_steps {
            // Room first, off the lock: a step's pushes (a zspage per move
            // changing fullness group, the emptied one retired) then find
            // it, unless one zspage holds more objects than it keeps.
            let mut state = self.lock_with_room(class);
            if !state.can_compact(&class.spec) {
                break;
            }
            let Some(src) = state.emptiest_partial_except(&pinned) else {
                break;
            };
            let (pages, _moved) = self.empty_zspage(class, &mut state, src, relocate);
            // Compaction is there to give memory back: keep no spares
            // beyond the reserve's.
            let keep = self.reserve_want(class, &state);
            self.release_dead_keeping(class, &mut state, keep);
            drop(state);
            freed += pages;
            if pages == 0 {
                pinned.push(src);
            }
        }
        freed
    }

    /// Moves every movable object of zspage `src` into fuller zspages.
    /// Returns (pages freed, objects moved).
    fn empty_zspage(
        &self,
        class: &SizeClass,
        state: &mut ClassState,
        src: u64,
        relocate: &dyn Relocate,
    ) -> (u64, u64) {
        let size = class.spec.size as usize;
        let src_addr = class.dir.zspage_addr(src);
        let (mut freed, mut moved) = (0, 0);
        for idx in 0..class.spec.objs {
            let owner = match state.zs.get(src as usize) {
                Some(z) if z.is_live() => z.owners[idx as usize],
                // The zspage emptied (its last object moved) and is gone.
                _ => break,
            };
            if owner & FREE != 0 {
                continue;
            }
            let Some(dst) = state.fullest_partial(Some(src)) else {
                break;
            };
            if state.zs[dst as usize].inuse < state.zs[src as usize].inuse {
                // Moving into an emptier zspage frees nothing.
                break;
            }
            let old = super::handle(class.index, src, idx);
            let mut new: Handle = 0;
            let ok = relocate.relocate(owner, old, &mut || {
                let h = Self::take_obj(class, state, dst, owner);
                let (_, id, to) = unpack(h);
                let dst_addr = class.dir.zspage_addr(id) + to as usize * size;
                // SAFETY: both objects are live in mapped zspages of this
                // class and distinct; the source is pinned by the slot lock
                // `relocate` holds, the destination is new and unpublished.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (src_addr + idx as usize * size) as *const u8,
                        dst_addr as *mut u8,
                        size,
                    );
                }
                new = h;
                Some(h)
            });
            if ok {
                crate::crash_point::point("compact:moved");
                moved += 1;
                freed += self.free_obj(class, state, src, idx);
            } else if new != 0 {
                // The relocator copied but did not install: undo the copy.
                let (_, id, to) = unpack(new);
                self.free_obj(class, state, id, to);
            }
        }
        (freed, moved)
    }
}
