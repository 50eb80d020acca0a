//! lz4_flex's block compressor behind one plain function.
//!
//! lz4_flex's public functions are `#[inline]` and its compressor is
//! generic, so its machine code is generated in whichever crate calls it,
//! with that crate's compiler flags. The fuzz build (`fuzz/run.sh`) traces
//! every comparison of zblk's own crates for libFuzzer, and inside lz4's
//! match loop that tracing was 40-45 % of the store targets' time (perf,
//! fuzz/README.md) while guiding the fuzzer through lz4_flex's code, not
//! zblk's. Called through this non-generic, never-inlined function, the
//! compressor is generated here, in a crate the fuzz build compiles without
//! coverage instrumentation (AddressSanitizer still on). Release builds
//! are unchanged but for one call per compressed buffer.
//!
//! Only the compressor: decompression stays in zblk, instrumented, because
//! how lz4 decoding meets a corrupted object is what `corrupt_objects`
//! explores.

pub use lz4_flex::block::{get_maximum_output_size, CompressError};

/// Compresses `src` into `dst` as one LZ4 block and returns its length.
/// `dst` must hold [`get_maximum_output_size`] of `src.len()`; lz4_flex
/// refuses smaller buffers with [`CompressError::OutputTooSmall`].
#[inline(never)]
pub fn compress_into(src: &[u8], dst: &mut [u8]) -> Result<usize, CompressError> {
    lz4_flex::block::compress_into(src, dst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_a_short_buffer() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i % 7) as u8).collect();
        let mut dst = vec![0; get_maximum_output_size(src.len())];
        let n = compress_into(&src, &mut dst).expect("fits");
        assert!(n < src.len() / 4);
        let mut back = vec![0; src.len()];
        let m = lz4_flex::block::decompress_into(&dst[..n], &mut back).expect("decodes");
        assert_eq!((m, &back), (src.len(), &src));
        assert!(compress_into(&src, &mut [0; 8]).is_err());
    }
}
