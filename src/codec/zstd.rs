//! Zstandard through the zstd crate's bulk API, with contexts kept per thread.
//!
//! The compression context lives in a workspace of its own, allocated and
//! faulted in once, when the codec is made (`ZSTD_initStaticCCtx`), sized
//! for the largest input the store gives it; so does the decompression
//! context (`ZSTD_initStaticDCtx`, see [`FixedDCtx`]). A context zstd allocates
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

/// An experiment's switch: `ZBLK_ZSTD_CCTX=dynamic` gives every codec made
/// afterwards zstd's own contexts instead of the fixed ones (an A/B of the
/// two in one boot; see BENCHMARKS.md, session 15).
const CCTX_ENV: &str = "ZBLK_ZSTD_CCTX";

/// Zstandard codec holding its own compression and decompression contexts,
/// so that no per-call context allocation happens on the I/O path.
pub struct ZstdCodec {
    level: i32,
    fixed: Option<FixedCCtx>,
    /// For inputs over what `fixed` was sized for (or without it).
    cctx: Option<zstd_safe::CCtx<'static>>,
    fixed_d: Option<FixedDCtx>,
    /// Without `fixed_d`, or for a frame it lacks the memory for.
    dctx: Option<zstd_safe::DCtx<'static>>,
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
        let mut workspace = touched_workspace(bytes);
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

/// `bytes` of 8-byte aligned memory (as zstd wants a static context's),
/// faulted in now, page by page (a zeroed allocation is not).
fn touched_workspace(bytes: usize) -> Box<[u64]> {
    let mut workspace = vec![0u64; bytes.div_ceil(8)].into_boxed_slice();
    for w in workspace.iter_mut().step_by(PAGE_SIZE / 8) {
        // SAFETY: `w` is a valid, exclusive element of the workspace.
        unsafe { std::ptr::write_volatile(w, 0) };
    }
    workspace
}

/// A decompression context in a workspace this codec owns. zstd's own
/// decompression context is one heap block of about 94 KB that is touched
/// only as it is used: a group whose literals went to its 64 KB literal
/// buffer wrote into pages no earlier call had touched (seen on 7.3, the
/// whole-machine workload: a queue thread in reclaim from that write,
/// after the compression context had been fixed).
struct FixedDCtx {
    ctx: NonNull<zstd_sys::ZSTD_DCtx>,
    _workspace: Box<[u64]>,
}

// SAFETY: as for `FixedCCtx`.
unsafe impl Send for FixedDCtx {}

impl FixedDCtx {
    /// A magicless-frame decompression context, or `None` if zstd refuses.
    fn new() -> Option<FixedDCtx> {
        // SAFETY: only computes a size.
        let bytes = unsafe { zstd_sys::ZSTD_estimateDCtxSize() };
        let mut workspace = touched_workspace(bytes);
        // SAFETY: the workspace is 8-byte aligned, `bytes` long at least,
        // and outlives the context (both live in the returned struct).
        let ctx = unsafe {
            zstd_sys::ZSTD_initStaticDCtx(workspace.as_mut_ptr().cast(), workspace.len() * 8)
        };
        let fixed = FixedDCtx {
            ctx: NonNull::new(ctx)?,
            _workspace: workspace,
        };
        // SAFETY: `ctx` is a live context the struct owns.
        let r = unsafe {
            zstd_sys::ZSTD_DCtx_setParameter(
                fixed.ctx.as_ptr(),
                zstd_sys::ZSTD_dParameter::ZSTD_d_experimentalParam1,
                zstd_sys::ZSTD_format_e::ZSTD_f_zstd1_magicless as i32,
            )
        };
        // SAFETY: ZSTD_isError only reads the code.
        (unsafe { zstd_sys::ZSTD_isError(r) } == 0).then_some(fixed)
    }

    /// `ZSTD_decompressDCtx`: the decompressed size or zstd's error code.
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, usize> {
        // SAFETY: `ctx` is a live context this struct owns; `dst` and `src`
        // are valid for the lengths passed.
        let r = unsafe {
            zstd_sys::ZSTD_decompressDCtx(
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

/// A decompression context zstd allocates itself, for magicless frames.
fn dynamic_dctx() -> zstd_safe::DCtx<'static> {
    let mut dctx = zstd_safe::DCtx::create();
    let _ = dctx.set_parameter(zstd_safe::DParameter::Format(
        zstd_safe::FrameFormat::Magicless,
    ));
    dctx
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
        let dynamic = std::env::var(CCTX_ENV).is_ok_and(|v| v == "dynamic");
        let (fixed, fixed_d) = match dynamic {
            true => (None, None),
            false => (FixedCCtx::new(level, pages), FixedDCtx::new()),
        };
        if !dynamic && (fixed.is_none() || fixed_d.is_none()) {
            log::warn!("zstd: no fixed context; zstd allocates its own");
        }
        ZstdCodec {
            level,
            fixed,
            cctx: None,
            dctx: fixed_d.is_none().then(dynamic_dctx),
            fixed_d,
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
        let mut r = None;
        if let Some(f) = self.fixed_d.as_mut() {
            match f.decompress(src, dst) {
                // Out of memory in a static context: the ordinary one below.
                Err(code) if zstd_safe::get_error_name(code).contains("allocation") => {}
                other => r = Some(other),
            }
        }
        let r = match r {
            Some(r) => r,
            None => self
                .dctx
                .get_or_insert_with(dynamic_dctx)
                .decompress(dst, src),
        };
        match r {
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
