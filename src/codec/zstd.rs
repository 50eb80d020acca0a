//! Zstandard through the zstd crate's bulk API, with contexts kept per thread.
//!
//! The compression context lives in a workspace of its own, allocated and
//! faulted in once, when the codec is made (`ZSTD_initStaticCCtx`), sized
//! for the largest input the store gives it. A context zstd allocates
//! itself sizes its workspace to each input and reallocates it whenever an
//! input needs more, or far less for 128 calls in a row (at level 1 a
//! page needs 72 KB, a group of 3-4 pages 213 KB, a group of 8 177 KB), so
//! a packed store's mix of group sizes kept reallocating it, on a queue
//! thread, into heap memory never touched before: under memory pressure,
//! a page fault into direct reclaim that waits on the very swap writes the
//! thread is there to complete (seen on 6.12, the whole-machine workload:
//! both queue threads in reclaim from a write into a new page of the
//! workspace, 17 MB into their malloc arena). An input larger than the
//! workspace was sized for goes to an ordinary context, made on first use.

use super::{Algo, Codec, CodecError};
use crate::page::PAGE_SIZE;
use std::ptr::NonNull;
use zstd::zstd_safe;
use zstd::zstd_safe::zstd_sys;

/// Zstandard codec holding its own compression and decompression contexts,
/// so that no per-call context allocation happens on the I/O path.
pub struct ZstdCodec {
    level: i32,
    fixed: Option<FixedCCtx>,
    /// For inputs over what `fixed` was sized for (or without it).
    cctx: Option<zstd_safe::CCtx<'static>>,
    dctx: zstd_safe::DCtx<'static>,
}

/// A compression context in a workspace this codec owns (8-byte aligned,
/// as zstd asks), with the largest input it was sized for.
struct FixedCCtx {
    ctx: NonNull<zstd_sys::ZSTD_CCtx>,
    max_src: usize,
    _workspace: Box<[u64]>,
}

// SAFETY: the context is used only through `&mut ZstdCodec` and points into
// the workspace the struct owns; zstd contexts are not tied to a thread.
unsafe impl Send for FixedCCtx {}

impl FixedCCtx {
    /// A context for level `level` and inputs of up to `pages` pages, or
    /// `None` if zstd refuses.
    fn new(level: i32, pages: usize) -> Option<FixedCCtx> {
        let bytes = (1..=pages.max(1))
            // SAFETY: both calls only compute from their arguments.
            .map(|k| unsafe {
                zstd_sys::ZSTD_estimateCCtxSize_usingCParams(zstd_sys::ZSTD_getCParams(
                    level,
                    (k * PAGE_SIZE) as u64,
                    0,
                ))
            })
            .max()?;
        let mut workspace = vec![0u64; bytes.div_ceil(8)].into_boxed_slice();
        // Faulted in now, page by page (a zeroed allocation is not).
        for w in workspace.iter_mut().step_by(PAGE_SIZE / 8) {
            // SAFETY: `w` is a valid, exclusive element of the workspace.
            unsafe { std::ptr::write_volatile(w, 0) };
        }
        // SAFETY: the workspace is 8-byte aligned, `bytes` long at least,
        // and outlives the context (both live in the returned struct).
        let ctx = unsafe {
            zstd_sys::ZSTD_initStaticCCtx(workspace.as_mut_ptr().cast(), workspace.len() * 8)
        };
        let fixed = FixedCCtx {
            ctx: NonNull::new(ctx)?,
            max_src: pages.max(1) * PAGE_SIZE,
            _workspace: workspace,
        };
        let ok = fixed.set(zstd_sys::ZSTD_cParameter::ZSTD_c_compressionLevel, level)
            && fixed.set(zstd_sys::ZSTD_cParameter::ZSTD_c_contentSizeFlag, 0)
            && fixed.set(zstd_sys::ZSTD_cParameter::ZSTD_c_checksumFlag, 0)
            && fixed.set(zstd_sys::ZSTD_cParameter::ZSTD_c_dictIDFlag, 0)
            && fixed.set(
                zstd_sys::ZSTD_cParameter::ZSTD_c_experimentalParam2,
                zstd_sys::ZSTD_format_e::ZSTD_f_zstd1_magicless as i32,
            );
        ok.then_some(fixed)
    }

    /// Sets one parameter; whether zstd took it.
    fn set(&self, p: zstd_sys::ZSTD_cParameter, v: i32) -> bool {
        // SAFETY: `ctx` is a live context this struct owns.
        let r = unsafe { zstd_sys::ZSTD_CCtx_setParameter(self.ctx.as_ptr(), p, v) };
        // SAFETY: ZSTD_isError only reads the code.
        unsafe { zstd_sys::ZSTD_isError(r) == 0 }
    }

    /// `ZSTD_compress2`: the compressed size or zstd's error code.
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, usize> {
        // SAFETY: `ctx` is a live context this struct owns; `dst` and `src`
        // are valid for the lengths passed.
        let r = unsafe {
            zstd_sys::ZSTD_compress2(
                self.ctx.as_ptr(),
                dst.as_mut_ptr().cast(),
                dst.len(),
                src.as_ptr().cast(),
                src.len(),
            )
        };
        // SAFETY: ZSTD_isError only reads the code.
        if unsafe { zstd_sys::ZSTD_isError(r) } == 0 {
            Ok(r)
        } else {
            Err(r)
        }
    }
}

/// A context zstd allocates itself, with this codec's parameters.
fn dynamic_cctx(level: i32) -> zstd_safe::CCtx<'static> {
    let mut cctx = zstd_safe::CCtx::create();
    // Frame metadata costs bytes per page; the slot already knows sizes.
    let _ = cctx.set_parameter(zstd_safe::CParameter::CompressionLevel(level));
    let _ = cctx.set_parameter(zstd_safe::CParameter::ContentSizeFlag(false));
    let _ = cctx.set_parameter(zstd_safe::CParameter::ChecksumFlag(false));
    let _ = cctx.set_parameter(zstd_safe::CParameter::DictIdFlag(false));
    let _ = cctx.set_parameter(zstd_safe::CParameter::Format(
        zstd_safe::FrameFormat::Magicless,
    ));
    cctx
}

impl ZstdCodec {
    /// Creates a zstd codec at `level` for inputs of up to 8 pages (larger
    /// ones are compressed too, by a context made on first use).
    pub fn new(level: i32) -> Self {
        Self::for_pages(level, 8)
    }

    /// Creates a zstd codec at `level` whose compression context is sized,
    /// and faulted in, for inputs of up to `pages` pages.
    pub fn for_pages(level: i32, pages: usize) -> Self {
        let fixed = FixedCCtx::new(level, pages);
        if fixed.is_none() {
            log::warn!("zstd: no fixed compression context; zstd allocates its own");
        }
        let mut dctx = zstd_safe::DCtx::create();
        let _ = dctx.set_parameter(zstd_safe::DParameter::Format(
            zstd_safe::FrameFormat::Magicless,
        ));
        ZstdCodec {
            level,
            fixed,
            cctx: None,
            dctx,
        }
    }
}

/// What a zstd error code means for a page: `Ok(None)` when the output did
/// not fit the budget (the page does not compress enough), else a failure.
fn refusal(code: usize) -> Result<Option<usize>, CodecError> {
    let name = zstd_safe::get_error_name(code);
    if name.contains("too small") {
        Ok(None)
    } else {
        Err(CodecError::Internal(format!("zstd: {name}")))
    }
}

impl Codec for ZstdCodec {
    fn algo(&self) -> Algo {
        Algo::Zstd(self.level)
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
        if let Some(f) = self.fixed.as_mut().filter(|f| src.len() <= f.max_src) {
            match f.compress(src, dst) {
                Ok(n) => return Ok(Some(n)),
                // dstSize_tooSmall: the page does not compress into the budget.
                Err(code) if !zstd_safe::get_error_name(code).contains("allocation") => {
                    return refusal(code)
                }
                // Sized too small after all: the ordinary context below.
                Err(_) => {}
            }
        }
        let level = self.level;
        let cctx = self.cctx.get_or_insert_with(|| dynamic_cctx(level));
        match cctx.compress2(dst, src) {
            Ok(n) => Ok(Some(n)),
            Err(code) => refusal(code),
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        let want = dst.len();
        match self.dctx.decompress(dst, src) {
            Ok(n) if n == want => Ok(()),
            Ok(n) => Err(CodecError::Corrupt(format!(
                "zstd decoded {n} bytes, expected {want}"
            ))),
            Err(code) => Err(CodecError::Corrupt(format!(
                "zstd: {}",
                zstd_safe::get_error_name(code)
            ))),
        }
    }
}
