//! The device model checked on its own: it must accept and refuse raw
//! descriptors the way the documented hardware does, so that the backend
//! tests against it mean something.

use std::cell::UnsafeCell;
use zblk::accel::desc::*;
use zblk::accel::model::{Exec, ModelDevice, ModelWqConfig};
use zblk::accel::portal::{PortalOpener, Submit, Submitter};
use zblk::accel::sysfs::{WqInfo, WqMode};
use zblk::PAGE_SIZE;

fn portal(model: &ModelDevice, mode: WqMode, size: u32) -> Box<dyn Submitter> {
    let info = WqInfo {
        device: "iax1".into(),
        name: "wq1.0".into(),
        mode,
        size,
        max_transfer_size: 1 << 21,
        cdev: "/dev/iax/wq1.0".into(),
    };
    model.opener().open(&info).unwrap()
}

fn inline(mode: WqMode, size: u32) -> (ModelDevice, Box<dyn Submitter>) {
    let m = ModelDevice::new(1, &[ModelWqConfig::new("wq1.0", mode, size)], Exec::Inline).unwrap();
    let p = portal(&m, mode, size);
    (m, p)
}

fn text_page() -> Vec<u8> {
    b"swap pages are mostly small integers and pointers; "
        .iter()
        .cycle()
        .take(PAGE_SIZE)
        .copied()
        .collect()
}

/// A completion record the model writes into (through its address).
struct Rec(Box<UnsafeCell<IaxCompletionRecord>>);

impl Rec {
    fn new() -> Self {
        Rec(Box::new(UnsafeCell::new(IaxCompletionRecord::default())))
    }

    fn addr(&self) -> u64 {
        self.0.get() as u64
    }

    /// The record as last written (the model writes it before `submit`
    /// returns in Inline mode, or before its thread is joined).
    fn get(&self) -> IaxCompletionRecord {
        // SAFETY: live, aligned; no writer runs concurrently at this point.
        unsafe { std::ptr::read_volatile(self.0.get()) }
    }
}

fn compress_desc(src: &[u8], dst: &mut [u8], aecs: &AecsCompTable, rec: &Rec) -> IaxHwDesc {
    let mut d = IaxHwDesc::new(IAX_OPCODE_COMPRESS, COMPRESS_DESC_FLAGS);
    d.completion_addr = rec.addr();
    d.src1_addr = src.as_ptr() as u64;
    d.src1_size = src.len() as u32;
    d.dst_addr = dst.as_mut_ptr() as u64;
    d.max_dst_size = dst.len() as u32;
    d.op_flags = IAA_COMP_FLAGS;
    d.src2_addr = aecs as *const _ as u64;
    d.src2_size = AECS_COMP_SIZE as u32;
    d
}

fn status(rec: &Rec) -> u8 {
    rec.get().status
}

#[test]
fn compress_then_verify_decompress() {
    let (_m, p) = inline(WqMode::Shared, 4);
    let aecs = Box::new(AecsCompTable::fixed());
    let src = text_page();
    let mut dst = vec![0u8; PAGE_SIZE];
    let rec = Rec::new();
    let d = compress_desc(&src, &mut dst, &aecs, &rec);
    assert_eq!(p.submit(&d.to_bytes()).unwrap(), Submit::Accepted);
    assert_eq!(status(&rec), IAX_COMP_SUCCESS);
    let n = rec.get().output_size as usize;
    assert!(n > 0 && n < 200, "{n}");
    assert_eq!(rec.get().crc, libdeflater::crc32(&src));
    assert_eq!(
        miniz_oxide::inflate::decompress_to_vec(&dst[..n]).unwrap(),
        src
    );

    // Verify: decompress with output suppressed writes nothing, same CRC.
    let mut out = vec![0xaau8; PAGE_SIZE];
    let rec2 = Rec::new();
    let mut v = IaxHwDesc::new(IAX_OPCODE_DECOMPRESS, DECOMPRESS_DESC_FLAGS);
    v.completion_addr = rec2.addr();
    v.src1_addr = dst.as_ptr() as u64;
    v.src1_size = n as u32;
    v.dst_addr = out.as_mut_ptr() as u64;
    v.max_dst_size = PAGE_SIZE as u32;
    v.op_flags = IAA_DECOMP_FLAGS | IAA_DECOMP_SUPPRESS_OUTPUT;
    p.submit(&v.to_bytes()).unwrap();
    assert_eq!(
        (
            status(&rec2),
            rec2.get().output_size as usize,
            rec2.get().crc
        ),
        (IAX_COMP_SUCCESS, PAGE_SIZE, rec.get().crc)
    );
    assert!(
        out.iter().all(|&b| b == 0xaa),
        "suppressed output was written"
    );

    // Too small an output buffer: decompress overflow.
    let rec3 = Rec::new();
    v.completion_addr = rec3.addr();
    v.max_dst_size = 1000;
    v.op_flags = IAA_DECOMP_FLAGS;
    p.submit(&v.to_bytes()).unwrap();
    assert_eq!(status(&rec3), IAX_COMP_OUTBUF_OVERFLOW);
}

#[test]
fn malformed_descriptors_are_refused_like_the_device() {
    let (m, p) = inline(WqMode::Shared, 4);
    let aecs = Box::new(AecsCompTable::fixed());
    let src = text_page();
    let mut dst = vec![0u8; PAGE_SIZE];
    type Case = (&'static str, fn(&mut IaxHwDesc), u8);
    let cases: [Case; 5] = [
        (
            "no AECS flag",
            |d| d.flags_opcode &= !IDXD_OP_FLAG_RD_SRC2_AECS,
            IAX_COMP_INVALID_FLAGS,
        ),
        (
            "wrong AECS size",
            |d| d.src2_size = 1024,
            IAX_COMP_INVALID_FLAGS,
        ),
        (
            "no EOB",
            |d| d.op_flags = IAA_COMP_FLUSH_OUTPUT,
            IAX_COMP_INVALID_FLAGS,
        ),
        ("empty input", |d| d.src1_size = 0, IAX_COMP_INVALID_SIZE),
        (
            "bad opcode",
            |d| d.flags_opcode = (d.flags_opcode & 0xff_ffff) | (0x50 << 24),
            IAX_COMP_BAD_OPCODE,
        ),
    ];
    for (what, mutate, want) in cases {
        let rec = Rec::new();
        let mut d = compress_desc(&src, &mut dst, &aecs, &rec);
        mutate(&mut d);
        p.submit(&d.to_bytes()).unwrap();
        assert_eq!(status(&rec), want, "{what}");
    }
    // Tiny output budget: analytics error with the compress-overflow code.
    let rec = Rec::new();
    let d = compress_desc(&src, &mut dst[..8], &aecs, &rec);
    p.submit(&d.to_bytes()).unwrap();
    assert_eq!(
        (status(&rec), rec.get().error_code),
        (IAX_COMP_ANALYTICS_ERROR, IAA_ERROR_COMP_BUF_OVERFLOW)
    );
    // A completion record that is not 64-byte aligned is never written.
    let recs = [Rec::new(), Rec::new()];
    let mut d = compress_desc(&src, &mut dst, &aecs, &recs[0]);
    d.completion_addr += 8;
    p.submit(&d.to_bytes()).unwrap();
    assert_eq!(m.stats().bad_completion, 1);
    assert!(recs
        .iter()
        .all(|r| r.get() == IaxCompletionRecord::default()));
}

#[test]
fn full_queues_behave_like_hardware() {
    // Shared WQ (ENQCMD): "retry" when full, nothing queued.
    let m = ModelDevice::new(
        1,
        &[ModelWqConfig::new("wq1.0", WqMode::Shared, 2)],
        Exec::Thread,
    )
    .unwrap();
    let p = portal(&m, WqMode::Shared, 2);
    m.pause(true);
    let aecs = Box::new(AecsCompTable::fixed());
    let src = text_page();
    let mut dst = vec![0u8; 3 * PAGE_SIZE];
    let recs = [Rec::new(), Rec::new(), Rec::new()];
    let descs: Vec<IaxHwDesc> = dst
        .chunks_mut(PAGE_SIZE)
        .zip(recs.iter())
        .map(|(out, rec)| compress_desc(&src, out, &aecs, rec))
        .collect();
    let answers: Vec<Submit> = descs
        .iter()
        .map(|d| p.submit(&d.to_bytes()).unwrap())
        .collect();
    assert_eq!(answers, [Submit::Accepted, Submit::Accepted, Submit::Retry]);
    m.pause(false);
    drop(m); // drains the queue
    assert_eq!(status(&recs[0]), IAX_COMP_SUCCESS);
    assert_eq!(status(&recs[2]), IAX_COMP_NONE);

    // Dedicated WQ (MOVDIR64B): posted, so a descriptor beyond the size is
    // lost without a word; the backend must bound in-flight work itself.
    let m = ModelDevice::new(
        1,
        &[ModelWqConfig::new("wq1.0", WqMode::Dedicated, 2)],
        Exec::Thread,
    )
    .unwrap();
    let p = portal(&m, WqMode::Dedicated, 2);
    m.pause(true);
    let recs2 = [Rec::new(), Rec::new(), Rec::new()];
    let mut dst = vec![0u8; 3 * PAGE_SIZE];
    for (out, rec) in dst.chunks_mut(PAGE_SIZE).zip(recs2.iter()) {
        let d = compress_desc(&src, out, &aecs, rec);
        assert_eq!(p.submit(&d.to_bytes()).unwrap(), Submit::Accepted);
    }
    assert_eq!(m.stats().dropped, 1);
    m.pause(false);
    drop(m);
    assert_eq!(status(&recs2[1]), IAX_COMP_SUCCESS);
    assert_eq!(status(&recs2[2]), IAX_COMP_NONE);
}
