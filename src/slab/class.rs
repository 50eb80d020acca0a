//! The size-class table: which object sizes share a class, and how many
//! pages each class's zspages span.
//!
//! As in zsmalloc: classes are `CLASS_DELTA` (16) bytes apart from
//! `MIN_OBJ` up to a whole page; each class picks the zspage length (1 to
//! `MAX_ZSPAGE_PAGES` pages) that wastes the least of the zspage, objects
//! being packed back to back and so straddling page boundaries; and
//! neighbouring classes that would pack the same number of objects into the
//! same number of pages are merged into the larger one, since the larger
//! slot holds the smaller objects at no extra cost.
//!
//! Beyond zsmalloc: objects larger than a page (a packed compression group
//! and its header, up to [`MAX_OBJ`]) get large classes spaced
//! geometrically, each `1/LARGE_STEP_DIV` larger than the one before (at
//! most 3 % rounding), in zspages of up to `LARGE_ZSPAGE_FACTOR` times the
//! object's page span.

use crate::page::PAGE_SIZE;

/// Smallest object slot: anything smaller is rounded up to it.
pub const MIN_OBJ: usize = 32;
/// Step between neighbouring size classes.
pub const CLASS_DELTA: usize = 16;
/// Largest small object: a raw (huge) page.
pub const SMALL_MAX: usize = PAGE_SIZE;
/// Largest object: a packed group of the largest size (64 pages) that did
/// not compress at all, with room for its header.
pub const MAX_OBJ: usize = 65 * PAGE_SIZE;
/// Longest zspage of a small class, in pages (zsmalloc's default chain).
pub const MAX_ZSPAGE_PAGES: usize = 8;
/// Small size classes before merging: `MIN_OBJ`, `MIN_OBJ + 16`, ...,
/// `SMALL_MAX`.
pub const RAW_CLASSES: usize = (SMALL_MAX - MIN_OBJ) / CLASS_DELTA + 1;
/// Each large class is this fraction (1/32) larger than the one before.
pub const LARGE_STEP_DIV: usize = 32;
/// A large class's zspage spans at most this many times its object's pages.
pub const LARGE_ZSPAGE_FACTOR: usize = 4;

/// One (merged) size class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassSpec {
    /// Slot size in bytes: every object of the class takes this much.
    pub size: u32,
    /// Pages per zspage.
    pub pages: u32,
    /// Objects per zspage.
    pub objs: u32,
}

impl ClassSpec {
    /// Bytes of one zspage.
    pub fn zspage_bytes(&self) -> usize {
        self.pages as usize * PAGE_SIZE
    }

    /// Bytes of each zspage no object can use.
    #[cfg(test)]
    fn waste(&self) -> usize {
        self.zspage_bytes() - self.objs as usize * self.size as usize
    }
}

/// Waste, in percent of the zspage, that a shorter zspage may have over
/// the least wasteful length and still be chosen.
pub const SHORTER_ZSPAGE_SLACK_PERCENT: usize = 2;

/// The zspage length for objects of `size` bytes: the shortest whose tail
/// waste is within [`SHORTER_ZSPAGE_SLACK_PERCENT`] of the least wasteful
/// length's (as a share of the zspage). Each class keeps one partly filled
/// zspage, whose free room is waste too, and it is smaller the shorter the
/// zspage: on the real-memory corpus (50 MB, lz4) this slack takes
/// `orig_data_size / mem_used_total` from 2.68 to 2.76 and costs nothing
/// measurable at 250 MB (2.845 vs 2.846).
pub fn best_pages(size: usize) -> usize {
    if size > SMALL_MAX {
        let span = size.div_ceil(PAGE_SIZE);
        return best_pages_in(size, span, span * LARGE_ZSPAGE_FACTOR);
    }
    best_pages_in(size, 1, MAX_ZSPAGE_PAGES)
}

/// [`best_pages`] over zspage lengths `lo..=hi` (`size <= lo` pages).
fn best_pages_in(size: usize, lo: usize, hi: usize) -> usize {
    // Waste shares as fractions w/b, compared exactly in integers.
    let share = |pages: usize| {
        let bytes = pages * PAGE_SIZE;
        (bytes % size, bytes)
    };
    let (bw, bb) = (lo..=hi)
        .map(share)
        .min_by(|&(w0, b0), &(w1, b1)| (w0 * b1).cmp(&(w1 * b0)))
        .unwrap_or((0, PAGE_SIZE));
    // w/b <= bw/bb + s/100  <=>  100*w*bb <= (100*bw + s*bb) * b
    (lo..=hi)
        .find(|&p| {
            let (w, b) = share(p);
            100 * w * bb <= (100 * bw + SHORTER_ZSPAGE_SLACK_PERCENT * bb) * b
        })
        .unwrap_or(lo)
}

/// The raw (unmerged) class index of an object of `size` bytes, or None if
/// it is larger than a page.
pub fn raw_index(size: usize) -> Option<usize> {
    if size > SMALL_MAX {
        return None;
    }
    Some(size.saturating_sub(MIN_OBJ).div_ceil(CLASS_DELTA))
}

/// The merged size classes and the map from raw index to class.
#[derive(Debug, Clone)]
pub struct ClassTable {
    /// Distinct classes, smallest slot first.
    pub specs: Vec<ClassSpec>,
    /// For each raw index, the class (index into `specs`) that serves it.
    pub map: Vec<u8>,
    /// Index in `specs` of the first large class.
    pub first_large: usize,
}

/// The slot sizes of the large classes, ascending, the last `>= MAX_OBJ`.
pub fn large_sizes() -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut s = SMALL_MAX;
    while s < MAX_OBJ {
        s = (s + s / LARGE_STEP_DIV)
            .next_multiple_of(CLASS_DELTA)
            .min(MAX_OBJ);
        sizes.push(s);
    }
    sizes
}

impl ClassTable {
    /// Builds the table, merging classes that pack identically.
    pub fn new() -> Self {
        // Walk from the largest size down, as zsmalloc does: a class merges
        // into the one above it when both have the same zspage shape.
        let mut rev: Vec<ClassSpec> = Vec::new();
        let mut map_rev = Vec::with_capacity(RAW_CLASSES);
        for raw in (0..RAW_CLASSES).rev() {
            let size = MIN_OBJ + raw * CLASS_DELTA;
            let pages = best_pages(size);
            let objs = (pages * PAGE_SIZE / size) as u32;
            match rev.last() {
                Some(prev) if prev.pages == pages as u32 && prev.objs == objs => {}
                _ => rev.push(ClassSpec {
                    size: size as u32,
                    pages: pages as u32,
                    objs,
                }),
            }
            map_rev.push(rev.len() - 1);
        }
        let n = rev.len();
        rev.reverse();
        // map_rev[k] is for raw index RAW_CLASSES-1-k; its class position
        // counted from the top is map_rev[k], from the bottom n-1-map_rev[k].
        let mut map = vec![0u8; RAW_CLASSES];
        for (k, &top) in map_rev.iter().enumerate() {
            map[RAW_CLASSES - 1 - k] = (n - 1 - top) as u8;
        }
        let first_large = rev.len();
        let mut specs = rev;
        for size in large_sizes() {
            let pages = best_pages(size);
            specs.push(ClassSpec {
                size: size as u32,
                pages: pages as u32,
                objs: (pages * PAGE_SIZE / size) as u32,
            });
        }
        ClassTable {
            specs,
            map,
            first_large,
        }
    }

    /// The class serving objects of `size` bytes (None above `MAX_OBJ`).
    pub fn class_of(&self, size: usize) -> Option<usize> {
        if size > SMALL_MAX {
            let large = &self.specs[self.first_large..];
            let k = large.partition_point(|s| (s.size as usize) < size);
            return (k < large.len()).then_some(self.first_large + k);
        }
        raw_index(size)
            .and_then(|r| self.map.get(r))
            .map(|&c| c as usize)
    }
}

impl Default for ClassTable {
    fn default() -> Self {
        Self::new()
    }
}

/// The one class table of this build, built on first use: it depends only
/// on constants, and building it (a search over zspage lengths for every
/// size) cost a fuzz input that made a small store about 9 % of its time.
pub fn classes() -> &'static ClassTable {
    static TABLE: std::sync::OnceLock<ClassTable> = std::sync::OnceLock::new();
    TABLE.get_or_init(ClassTable::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_maps_to_a_class_that_fits_it() {
        let t = ClassTable::new();
        // Handles keep class + 1 in their top byte.
        assert!(t.specs.len() <= 255, "{} classes", t.specs.len());
        for size in SMALL_MAX + 1..=MAX_OBJ {
            let c = t.class_of(size).unwrap();
            let spec = t.specs[c];
            assert!(spec.size as usize >= size);
            assert!(spec.size as usize <= size + size / LARGE_STEP_DIV + 2 * CLASS_DELTA);
            assert!(c == t.first_large || (t.specs[c - 1].size as usize) < size);
        }
        assert_eq!(t.class_of(MAX_OBJ + 1), None);
        for size in 0..=SMALL_MAX {
            let c = t.class_of(size).unwrap();
            let spec = t.specs[c];
            assert!(
                spec.size as usize >= size.max(1),
                "size {size} class {spec:?}"
            );
            // Never more than one raw step of rounding before merging, and
            // merging only ever lands in a class with the same zspage shape.
            let raw = raw_index(size).unwrap();
            let raw_size = MIN_OBJ + raw * CLASS_DELTA;
            let pages = best_pages(raw_size);
            assert_eq!(spec.pages as usize, pages);
            assert_eq!(spec.objs as usize, pages * PAGE_SIZE / raw_size);
        }
    }

    #[test]
    fn classes_are_sorted_distinct_and_shaped_sanely() {
        let t = ClassTable::new();
        for w in t.specs.windows(2) {
            assert!(w[0].size < w[1].size);
        }
        // Merging left no two small classes with the same shape.
        for w in t.specs[..t.first_large].windows(2) {
            assert!((w[0].pages, w[0].objs) != (w[1].pages, w[1].objs));
        }
        for s in &t.specs[..t.first_large] {
            assert!((1..=MAX_ZSPAGE_PAGES as u32).contains(&s.pages));
            assert!(s.objs >= 1 && s.objs <= 1024);
            assert!(s.waste() < s.size as usize);
        }
        for s in &t.specs[t.first_large..] {
            let span = (s.size as usize).div_ceil(PAGE_SIZE) as u32;
            assert!((span..=span * LARGE_ZSPAGE_FACTOR as u32).contains(&s.pages));
            // span pages < size + 1 page <= 2 * size: fewer than 2 * factor.
            assert!(s.objs >= 1 && s.objs < 2 * LARGE_ZSPAGE_FACTOR as u32);
        }
        let last_small = t.specs[t.first_large - 1];
        assert_eq!(
            (last_small.size, last_small.pages, last_small.objs),
            (4096, 1, 1)
        );
        assert_eq!(t.specs.last().unwrap().size as usize, MAX_OBJ);
        assert_eq!(t.specs[0].size as usize, MIN_OBJ);
    }

    #[test]
    fn best_pages_minimises_waste_with_slack_for_shorter() {
        // 3 objects of 1360 in one page waste 16 bytes: 1 page is best.
        assert_eq!(best_pages(1360), 1);
        // 4096/3000 wastes 1096 (27%); 3 pages hold 4 objects wasting 288
        // (2.3%), as little as any length: 3.
        assert_eq!(best_pages(3000), 3);
        assert_eq!(best_pages(4096), 1);
        assert_eq!(best_pages(2048), 1);
        // 1168: 1 page wastes 592 (14%), 2 pages 16 (0.2%, the least): 2.
        assert_eq!(best_pages(1168), 2);
        // 1440: the least is 6 pages wasting 96 (0.4%); 5 pages waste 320
        // (1.6%), within the slack, and shorter ones 3.3% or more: 5.
        assert_eq!(best_pages(1440), 5);
        for size in (32..=4096).step_by(16) {
            let p = best_pages(size);
            let waste = |p: usize| ((p * PAGE_SIZE) % size) as f64 / (p * PAGE_SIZE) as f64;
            let least = (1..=MAX_ZSPAGE_PAGES).map(waste).fold(1.0, f64::min);
            assert!(waste(p) <= least + 0.02 + 1e-12, "size {size}");
            for shorter in 1..p {
                assert!(waste(shorter) > least + 0.02 - 1e-12, "size {size}");
            }
        }
    }
}
