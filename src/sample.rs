//! Pages sampled across the device, decoded, for a dictionary
//! (`zblk dict train`): what the device stores is what a dictionary for it
//! should hold.
//!
//! A sample reads pages under their slot locks as recompression does: not
//! an access (no access time, no idle mark cleared), one lock at a time.
//! Empty and same-filled pages are left out: they cost nothing to store,
//! and a dictionary of them would teach a codec nothing.

use crate::ctx::CtxState;
use crate::page::PAGE_SIZE;
use crate::read::read_entry;
use crate::slot::Kind;
use crate::table::SlotTable;

/// Most slots looked at (evenly spaced; every one of a device of up to
/// 256 MB): the stored pages among them are the candidates `want` are
/// picked from evenly, and their indices are all a sample holds meanwhile.
const MAX_CANDIDATES: u64 = 1 << 16;

/// Up to `want` stored pages (not empty, not same-filled), spread evenly
/// over the device, decoded and concatenated in page order.
pub(crate) fn sample(table: &SlotTable, st: &mut CtxState, want: usize) -> Vec<u8> {
    let pages = table.pages();
    let stride = pages.div_ceil(MAX_CANDIDATES).max(1);
    let stored: Vec<u64> = (0..pages)
        .step_by(stride as usize)
        .filter(|&p| holds_content(table.lock(p).entry().kind))
        .collect();
    let n = want.min(stored.len());
    let picked = (0..n).map(|i| stored[i * stored.len() / n]);
    let mut out = Vec::with_capacity(want * PAGE_SIZE);
    let mut buf = vec![0u8; PAGE_SIZE];
    for page in picked {
        let guard = table.lock(page);
        let e = guard.entry();
        // Changed since it was looked at, or unreadable: left out.
        if holds_content(e.kind) && read_entry(table, st, page, &e, &mut buf).is_ok() {
            out.extend_from_slice(&buf);
        }
    }
    out
}

/// Whether a slot of `kind` holds a page worth sampling.
fn holds_content(kind: Kind) -> bool {
    !matches!(kind, Kind::Empty | Kind::Same)
}
