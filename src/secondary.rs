//! The store's secondary algorithms (zram's `recomp_algorithm` with its
//! priorities): up to [`MAX_SECONDARIES`] of them, entry `i` (1-based) the
//! one a slot's `algo` value `i` names.
//!
//! Each entry is set once and never changes: a slot naming it may exist
//! from then on, and a recovery reads the same list back from the store's
//! header. The list is filled in the order algorithms are first asked for
//! (a recompression's list in its priority order, so the first list a
//! store is given is its entries 1, 2, 3), and only grows; only the
//! maintenance thread grows it, under the store's maintenance lock, and a
//! store in shared memory records the new list in its header before any
//! slot can name a new entry.

use crate::codec::Algo;
use crate::error::{Error, Result};
use std::sync::OnceLock;

/// Most secondary algorithms a store has: the slot's `algo` field has two
/// bits, 0 the primary.
pub const MAX_SECONDARIES: usize = 3;

/// Entries 1..=[`MAX_SECONDARIES`], each set once.
#[derive(Debug, Default)]
pub(crate) struct Secondaries {
    entries: [OnceLock<Algo>; MAX_SECONDARIES],
}

impl Secondaries {
    /// A list holding `algos` (a recovered store's, from its header), in
    /// order.
    pub(crate) fn from_list(algos: &[Algo]) -> Secondaries {
        let s = Secondaries::default();
        for (slot, &a) in s.entries.iter().zip(algos) {
            let _ = slot.set(a);
        }
        s
    }

    /// The algorithm slot value `algo` names (1..=3), if the store has it.
    pub(crate) fn get(&self, algo: u8) -> Option<Algo> {
        let i = usize::from(algo).checked_sub(1)?;
        self.entries.get(i)?.get().copied()
    }

    /// The entries set, in order.
    pub(crate) fn list(&self) -> Vec<Algo> {
        self.entries
            .iter()
            .map_while(|e| e.get().copied())
            .collect()
    }

    /// The slot values of `algos`, in their order, adding those the list
    /// lacks at its end; `record` is called with the grown list before it
    /// is set (a shared store writes its header there). Refuses a list
    /// that would grow past [`MAX_SECONDARIES`], leaving it as it was.
    /// Called by one thread at a time (the store's maintenance lock).
    pub(crate) fn assign(
        &self,
        algos: &[Algo],
        record: impl FnOnce(&[Algo]) -> Result<()>,
    ) -> Result<Vec<u8>> {
        let mut list = self.list();
        let had = list.len();
        for a in algos {
            if !list.contains(a) {
                list.push(*a);
            }
        }
        if list.len() > MAX_SECONDARIES {
            let names: Vec<String> = self.list().iter().map(Algo::to_string).collect();
            return Err(Error::InvalidConfig(format!(
                "this store's secondary algorithms are {} (recorded by its recompressions), \
                 and it has room for {MAX_SECONDARIES}: recompress with those",
                names.join(" ")
            )));
        }
        if list.len() > had {
            record(&list)?;
            for (slot, &a) in self.entries.iter().zip(&list).skip(had) {
                let _ = slot.set(a);
            }
        }
        Ok(algos
            .iter()
            .filter_map(|a| list.iter().position(|b| b == a))
            .map(|i| i as u8 + 1)
            .collect())
    }
}

/// Secondary algorithms in the order a recompression tries them (zram's
/// `recomp_algorithm` priorities 1, 2, 3): one to [`MAX_SECONDARIES`],
/// none twice. Written as names separated by spaces (or commas):
/// `"lz4hc zstd:3 zstd:19"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlgoList {
    algos: [Algo; MAX_SECONDARIES],
    len: usize,
}

impl AlgoList {
    /// The list of `algos`, or why it is not one.
    pub fn new(algos: &[Algo]) -> std::result::Result<AlgoList, String> {
        if algos.is_empty() || algos.len() > MAX_SECONDARIES {
            return Err(format!(
                "expected 1 to {MAX_SECONDARIES} secondary algorithms, got {}",
                algos.len()
            ));
        }
        let mut list = AlgoList {
            algos: [algos[0]; MAX_SECONDARIES],
            len: 0,
        };
        for &a in algos {
            if list.as_slice().contains(&a) {
                return Err(format!("{a} is listed twice"));
            }
            list.algos[list.len] = a;
            list.len += 1;
        }
        Ok(list)
    }

    /// The list of one algorithm.
    pub fn one(algo: Algo) -> AlgoList {
        AlgoList {
            algos: [algo; MAX_SECONDARIES],
            len: 1,
        }
    }

    /// The algorithms, in order.
    pub fn as_slice(&self) -> &[Algo] {
        &self.algos[..self.len]
    }

    /// The algorithm of priority `n` (1-based), as `--priority N` names it.
    pub fn priority(&self, n: usize) -> std::result::Result<Algo, String> {
        n.checked_sub(1)
            .and_then(|i| self.as_slice().get(i).copied())
            .ok_or_else(|| {
                format!(
                    "priority {n} is not in the list '{self}' (1..={})",
                    self.len
                )
            })
    }
}

impl std::str::FromStr for AlgoList {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<AlgoList, String> {
        let algos = s
            .split([' ', ','])
            .filter(|n| !n.is_empty())
            .map(str::parse)
            .collect::<std::result::Result<Vec<Algo>, String>>()?;
        AlgoList::new(&algos).map_err(|e| format!("'{s}': {e}"))
    }
}

impl std::fmt::Display for AlgoList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&list_to_string(self.as_slice()))
    }
}

/// Names separated by spaces, as [`AlgoList`] reads them.
pub(crate) fn list_to_string(list: &[Algo]) -> String {
    list.iter()
        .map(Algo::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_print() {
        let l: AlgoList = "lz4hc zstd:3,zstd:19".parse().unwrap();
        let want = [Algo::Lz4Hc(9), Algo::Zstd(3), Algo::Zstd(19)];
        assert_eq!(l.as_slice(), want);
        assert_eq!(l.to_string(), "lz4hc zstd:3 zstd:19");
        assert_eq!(l.to_string().parse::<AlgoList>(), Ok(l));
        assert_eq!(l.priority(2), Ok(Algo::Zstd(3)));
        assert!(l.priority(0).is_err() && l.priority(4).is_err());
        assert_eq!(
            " zstd ".parse::<AlgoList>(),
            Ok(AlgoList::one(Algo::Zstd(1)))
        );
        for bad in ["", " ", "lz4 zstd lz4hc deflate", "zstd zstd:1", "zstd lzo"] {
            assert!(bad.parse::<AlgoList>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn entries_are_assigned_in_order_and_only_grow() {
        let s = Secondaries::default();
        let mut recorded = Vec::new();
        let a = [Algo::Lz4Hc(9), Algo::Zstd(3)];
        let v = s
            .assign(&a, |l| {
                recorded = l.to_vec();
                Ok(())
            })
            .unwrap();
        assert_eq!(v, vec![1, 2]);
        assert_eq!(recorded, a.to_vec());
        // Known ones keep their place; a new one takes the next.
        let v = s
            .assign(&[Algo::Zstd(19), Algo::Lz4Hc(9)], |_| Ok(()))
            .unwrap();
        assert_eq!(v, vec![3, 1]);
        assert_eq!(s.get(3), Some(Algo::Zstd(19)));
        assert_eq!(s.get(0), None);
        assert_eq!(s.get(4), None);
        // Full: a fourth is refused and nothing changes.
        assert!(s.assign(&[Algo::Deflate(9)], |_| Ok(())).is_err());
        assert_eq!(s.list().len(), 3);
        // Nothing new: nothing recorded.
        s.assign(&[Algo::Zstd(3)], |_| panic!("not recorded"))
            .unwrap();
    }

    #[test]
    fn a_failed_record_sets_nothing() {
        let s = Secondaries::default();
        let e = s.assign(&[Algo::Zstd(3)], |_| Err(Error::InvalidConfig("no".into())));
        assert!(e.is_err());
        assert!(s.list().is_empty());
        assert_eq!(
            Secondaries::from_list(&[Algo::Zstd(3)]).get(1),
            Some(Algo::Zstd(3))
        );
    }
}
