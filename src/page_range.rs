//! Page ranges: pages `first` to `last` of a device, by index, as zram's
//! `page_index=` and `page_indexes=` name them: what `zblk writeback
//! --pages` and the writeback and recompression of a cgroup's pages
//! (`--cgroup`) select.

use crate::error::{Error, Result};
use std::ops::Range;

/// Pages `first` to `last` (inclusive) of a device, by index (zram's
/// `page_index=N` and `page_indexes=LOW-HIGH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRange {
    /// The first page.
    pub first: u64,
    /// The last page (inclusive).
    pub last: u64,
}

impl std::str::FromStr for PageRange {
    type Err = String;

    /// `N` or `LOW-HIGH` (inclusive, LOW <= HIGH).
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let index = |t: &str| {
            t.trim().parse::<u64>().map_err(|_| {
                format!("invalid page range '{s}': expected a page index N or LOW-HIGH")
            })
        };
        let (first, last) = match s.split_once('-') {
            Some((lo, hi)) => (index(lo)?, index(hi)?),
            None => (index(s)?, index(s)?),
        };
        if first > last {
            return Err(format!(
                "invalid page range '{s}': its first page is past its last"
            ));
        }
        Ok(PageRange { first, last })
    }
}

impl std::fmt::Display for PageRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// The pages of `list` on a device of `pages` pages, as ascending,
/// disjoint ranges (overlapping and adjacent ones merged, so that no page
/// is looked at twice); an error names a range past the device's end.
pub(crate) fn spans(list: &[PageRange], pages: u64) -> Result<Vec<Range<u64>>> {
    if let Some(r) = list.iter().find(|r| r.last >= pages) {
        return Err(Error::InvalidConfig(format!(
            "page range {r} is past the device's end (its pages are 0-{})",
            pages.saturating_sub(1)
        )));
    }
    let mut sorted: Vec<Range<u64>> = list.iter().map(|r| r.first..r.last + 1).collect();
    sorted.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match out.last_mut() {
            Some(prev) if r.start <= prev.end => prev.end = prev.end.max(r.end),
            _ => out.push(r),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_ranges_parse_as_zram_writes_them() {
        let r = |s: &str| s.parse::<PageRange>();
        assert_eq!(r("7"), Ok(PageRange { first: 7, last: 7 }));
        assert_eq!(r("3-9"), Ok(PageRange { first: 3, last: 9 }));
        assert_eq!(r("4-4"), Ok(PageRange { first: 4, last: 4 }));
        assert!(r("9-3")
            .unwrap_err()
            .contains("first page is past its last"));
        for bad in ["", "-", "x", "1-", "-5", "1-2-3", "0x10"] {
            assert!(r(bad).unwrap_err().contains("invalid page range"), "{bad}");
        }
        assert_eq!(r("3-9").unwrap().to_string(), "3-9");
        assert_eq!(r("7").unwrap().to_string(), "7");
    }

    #[test]
    fn spans_are_sorted_merged_and_inside_the_device() {
        let list: Vec<PageRange> = ["8-9", "0", "2-4", "3-5", "6"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(spans(&list, 10).unwrap(), vec![0..1, 2..7, 8..10]);
        let e = spans(&["2-10".parse().unwrap()], 10)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("page range 2-10 is past the device's end (its pages are 0-9)"),
            "{e}"
        );
        assert!(spans(&[], 10).unwrap().is_empty());
    }
}
