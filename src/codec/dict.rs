//! Compression dictionaries (zram's `algorithm_params dict=PATH`): bytes a
//! codec primes every page with, so that a page can refer back into
//! content typical of the device's pages instead of starting from nothing.
//!
//! A dictionary is raw content (for zstd, a trained zstd dictionary works
//! too: zstd tells the two apart by its magic number). It belongs to one
//! algorithm of the store (the primary, or a secondary) and is fixed for the
//! store's life, so a slot's algorithm index names its dictionary as well;
//! a store in shared memory records the bytes (`crate::shm`), so that the
//! process recovering it decodes without the file.

use super::Algo;
use std::sync::Arc;

/// The largest dictionary: LZ4's window. An LZ4 match reaches back at
/// most 64 KB, so liblz4 keeps only a dictionary's last 64 KB; zstd at the
/// levels a swap device uses (a page-sized input) gets little from more,
/// and a dictionary is loaded into every queue thread's codec.
pub const MAX_DICT_BYTES: usize = 64 * 1024;

/// The store's dictionaries, at most one per algorithm; cheap to clone
/// (the bytes are shared, each codec prepares its own state from them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dictionaries {
    entries: Vec<(Algo, Arc<[u8]>)>,
}

impl Algo {
    /// Whether this algorithm's codec can use a dictionary.
    pub fn takes_dictionary(&self) -> bool {
        matches!(self, Algo::Lz4 | Algo::Lz4Hc(_) | Algo::Zstd(_))
    }
}

impl Dictionaries {
    /// None.
    pub fn new() -> Dictionaries {
        Dictionaries::default()
    }

    /// Gives `algo` the dictionary `bytes`: refused (one line, naming the
    /// algorithm) for an algorithm without dictionaries, an empty or a
    /// too-large dictionary, or a second one for the same algorithm.
    pub fn set(&mut self, algo: Algo, bytes: Arc<[u8]>) -> Result<(), String> {
        if !algo.takes_dictionary() {
            return Err(format!(
                "{algo} takes no dictionary: only lz4, lz4hc and zstd do"
            ));
        }
        if bytes.is_empty() {
            return Err(format!("the dictionary for {algo} is empty"));
        }
        if bytes.len() > MAX_DICT_BYTES {
            return Err(format!(
                "the dictionary for {algo} is {} bytes: at most {MAX_DICT_BYTES}",
                bytes.len()
            ));
        }
        if let Algo::Zstd(level) = algo {
            super::zstd::check_dictionary(&bytes, level)
                .map_err(|e| format!("the dictionary for {algo}: {e}"))?;
        }
        if self.get(algo).is_some() {
            return Err(format!("{algo} is given a dictionary twice"));
        }
        self.entries.push((algo, bytes));
        Ok(())
    }

    /// The dictionary of `algo`, if it has one.
    pub fn get(&self, algo: Algo) -> Option<&Arc<[u8]>> {
        self.entries
            .iter()
            .find(|(a, _)| *a == algo)
            .map(|(_, d)| d)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Each algorithm and its dictionary, in the order they were set.
    pub fn iter(&self) -> impl Iterator<Item = (Algo, &Arc<[u8]>)> {
        self.entries.iter().map(|(a, d)| (*a, d))
    }

    /// A codec of `algo` for inputs of up to `pages` pages (see
    /// [`Algo::new_codec_for`]), with `algo`'s dictionary if it has one.
    pub fn codec_for(&self, algo: Algo, pages: usize) -> Box<dyn super::Codec> {
        match self.get(algo) {
            Some(d) => algo.new_codec_with(pages, Some(d.clone())),
            None => algo.new_codec_for(pages),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Codec;
    use crate::page::PAGE_SIZE;

    /// Pages of one kind of record (what a dictionary is for): each record
    /// the same template with a counter in it.
    fn records(seed: u32, bytes: usize) -> Vec<u8> {
        let mut v = Vec::new();
        let mut x = seed;
        while v.len() < bytes {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            v.extend_from_slice(b"{\"user\":\"");
            v.extend_from_slice(format!("{:08x}", x >> 3).as_bytes());
            v.extend_from_slice(b"\",\"state\":\"active\",\"flags\":[\"swap\",\"page\"]}\n");
        }
        v.truncate(bytes);
        v
    }

    const DICT_ALGOS: [Algo; 4] = [Algo::Lz4, Algo::Lz4Hc(9), Algo::Zstd(1), Algo::Zstd(3)];

    fn dict() -> Arc<[u8]> {
        Arc::from(records(1, 16 * 1024))
    }

    #[test]
    fn dictionary_codecs_round_trip_and_compress_better() {
        let page = records(2, PAGE_SIZE);
        for algo in DICT_ALGOS {
            for pages in [1, 8] {
                let mut plain = algo.new_codec_for(pages);
                let mut c = algo.new_codec_with(pages, Some(dict()));
                assert_eq!(c.algo(), algo);
                let mut dst = vec![0u8; 2 * PAGE_SIZE];
                let alone = plain.compress(&page, &mut dst).unwrap().unwrap();
                let n = c.compress(&page, &mut dst).unwrap().expect("fits");
                assert!(n < alone, "{algo}: {n} with a dictionary, {alone} without");
                let mut back = vec![0u8; PAGE_SIZE];
                // Another codec of the same dictionary decodes it.
                algo.new_codec_with(0, Some(dict()))
                    .decompress(&dst[..n], &mut back)
                    .unwrap();
                assert!(back == page, "{algo}");
                // The state is reused page after page.
                assert_eq!(c.compress(&page, &mut dst).unwrap(), Some(n), "{algo}");
                let big = records(3, 8 * PAGE_SIZE);
                let mut out = vec![0u8; 16 * PAGE_SIZE];
                let m = c.compress(&big, &mut out).unwrap().unwrap();
                let mut back = vec![0u8; big.len()];
                c.decompress(&out[..m], &mut back).unwrap();
                assert!(back == big, "{algo} group");
                // Too small an output: a refusal, then the next page is fine.
                assert_eq!(c.compress(&page, &mut dst[..16]).unwrap(), None, "{algo}");
                assert_eq!(c.compress(&page, &mut dst).unwrap(), Some(n), "{algo}");
            }
        }
    }

    #[test]
    fn dictionary_decoders_refuse_corrupt_and_foreign_objects() {
        let page = records(2, PAGE_SIZE);
        let other: Arc<[u8]> = Arc::from(records(9, 16 * 1024));
        for algo in DICT_ALGOS {
            let mut c = algo.new_codec_with(1, Some(dict()));
            let mut dst = vec![0u8; 2 * PAGE_SIZE];
            let n = c.compress(&page, &mut dst).unwrap().unwrap();
            let mut back = vec![0u8; PAGE_SIZE];
            assert!(c.decompress(&dst[..n / 2], &mut back).is_err(), "{algo}");
            assert!(c.decompress(&[0xff; 64], &mut back).is_err(), "{algo}");
            assert!(
                c.decompress(&dst[..n], &mut back[..4095]).is_err(),
                "{algo}"
            );
            // Another dictionary, or none: never the page.
            for mut d in [
                algo.new_codec_with(1, Some(other.clone())),
                algo.new_codec_for(1),
            ] {
                let r = d.decompress(&dst[..n], &mut back);
                assert!(
                    r.is_err() || back != page,
                    "{algo} decoded without its dictionary"
                );
            }
        }
    }

    #[test]
    fn zstd_fixed_contexts_have_room_for_a_dictionary() {
        for level in [1, 3, 9] {
            for pages in [1, 8] {
                let mut c = super::super::ZstdCodec::with_dict(
                    level,
                    pages,
                    Some(Arc::from(records(1, MAX_DICT_BYTES))),
                );
                let data = records(4, pages * PAGE_SIZE);
                let mut dst = vec![0u8; 2 * data.len()];
                c.compress(&data, &mut dst).unwrap().unwrap();
                assert!(c.uses_fixed_contexts(), "zstd:{level}, {pages} pages");
            }
        }
    }

    #[test]
    fn dictionaries_refuse_what_no_codec_can_use() {
        let mut d = Dictionaries::new();
        for algo in [Algo::None, Algo::Deflate(1), Algo::DeflateIaa] {
            let e = d.set(algo, dict()).unwrap_err();
            assert!(e.contains("takes no dictionary"), "{e}");
        }
        assert!(d
            .set(Algo::Lz4, Arc::from(Vec::new()))
            .unwrap_err()
            .contains("empty"));
        let big = Arc::from(vec![1u8; MAX_DICT_BYTES + 1]);
        assert!(d.set(Algo::Lz4, big).unwrap_err().contains("at most 65536"));
        d.set(Algo::Lz4, dict()).unwrap();
        assert!(d.set(Algo::Lz4, dict()).unwrap_err().contains("twice"));
        // A damaged trained zstd dictionary (its magic, then nonsense).
        let mut bad = vec![0x37, 0xa4, 0x30, 0xec, 1, 0, 0, 0];
        bad.extend_from_slice(&[0xff; 100]);
        let e = d.set(Algo::Zstd(3), Arc::from(bad)).unwrap_err();
        assert!(e.contains("cannot load"), "{e}");
        assert!(d.get(Algo::Zstd(3)).is_none());
        assert_eq!(d.get(Algo::Lz4).map(|b| b.len()), Some(16 * 1024));
    }
}
