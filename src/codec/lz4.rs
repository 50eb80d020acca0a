//! LZ4 through lz4_flex's block format (no frame: the slot knows the sizes).

use super::{Algo, Codec, CodecError};

/// LZ4 block codec. lz4_flex keeps its hash table on the stack; the
/// instance holds a worst-case output buffer, because lz4_flex refuses to
/// start compressing into anything smaller than the worst case.
#[derive(Debug, Default)]
pub struct Lz4Codec {
    out: Vec<u8>,
}

impl Lz4Codec {
    /// Creates an LZ4 codec.
    pub fn new() -> Self {
        Lz4Codec {
            out: vec![0; lz4_flex::block::get_maximum_output_size(crate::page::PAGE_SIZE)],
        }
    }
}

impl Codec for Lz4Codec {
    fn algo(&self) -> Algo {
        Algo::Lz4
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
        let bound = lz4_flex::block::get_maximum_output_size(src.len());
        if dst.len() >= bound {
            return compress_fitting(src, dst);
        }
        if self.out.len() < bound {
            self.out.resize(bound, 0);
        }
        match compress_fitting(src, &mut self.out)? {
            Some(n) if n <= dst.len() => {
                dst[..n].copy_from_slice(&self.out[..n]);
                Ok(Some(n))
            }
            _ => Ok(None),
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        match lz4_flex::block::decompress_into(src, dst) {
            Ok(n) if n == dst.len() => Ok(()),
            Ok(n) => Err(CodecError::Corrupt(format!(
                "lz4 decoded {n} bytes, expected {}",
                dst.len()
            ))),
            Err(e) => Err(CodecError::Corrupt(format!("lz4: {e}"))),
        }
    }
}

/// Compresses into a buffer of at least the worst-case size, through
/// zblk-lz4 (the compressor generated in a crate of its own, for the fuzz
/// build; see there).
fn compress_fitting(src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
    zblk_lz4::compress_into(src, dst)
        .map(Some)
        .map_err(|e| CodecError::Internal(format!("lz4: {e}")))
}
