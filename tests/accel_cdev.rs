//! The real opener and `write()` submission path, end to end without
//! hardware: discovery through `$ZBLK_IAA_SYSFS_ROOT`, the cdev a regular
//! file under `$ZBLK_IAA_DEV_ROOT`. This CPU-independent path takes the
//! `write()` fallback whenever the portal cannot be used; nothing ever
//! completes, so every page must time out into software with correct data,
//! and the file holds exactly the descriptor bytes the kernel would get.
//! (One test per binary: the process-wide router reads the variables once.)

use std::path::Path;
use zblk::accel::desc::*;
use zblk::accel::model::{Exec, ModelDevice, ModelWqConfig};
use zblk::accel::sysfs::WqMode;
use zblk::codec::Codec;
use zblk::codec::IaaCodec;
use zblk::PAGE_SIZE;

#[test]
fn write_submission_times_out_into_software() {
    let sysfs = tempfile::tempdir().unwrap();
    let dev = tempfile::tempdir().unwrap();
    // A shared WQ: with no ENQCMD on this CPU or a portal that cannot be
    // mapped, submission is by write(); a regular file accepts every write.
    let model = ModelDevice::new(
        2,
        &[ModelWqConfig::new("wq2.0", WqMode::Shared, 8)],
        Exec::Inline,
    )
    .unwrap();
    model.write_sysfs(sysfs.path()).unwrap();
    let cdev = dev.path().join("wq2.0");
    std::fs::write(&cdev, b"").unwrap();
    std::env::set_var("ZBLK_IAA_SYSFS_ROOT", sysfs.path());
    std::env::set_var("ZBLK_IAA_DEV_ROOT", dev.path());
    std::env::set_var("ZBLK_IAA_TIMEOUT_US", "2000");

    let mut codec = IaaCodec::new();
    assert!(codec.uses_hardware());
    let z = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/realmem-96.bin.zst"),
    )
    .unwrap();
    let raw = zstd::decode_all(&z[..]).unwrap();
    let pages: Vec<&[u8]> = raw.chunks(PAGE_SIZE).skip(24).take(8).collect();
    let mut dst = vec![0u8; 8 * PAGE_SIZE];
    let mut out = Vec::new();
    for round in 0..2 {
        out.clear();
        let accel = codec
            .compress_batch(&pages, &mut dst, 3000, &mut out)
            .unwrap();
        assert_eq!(accel, 0);
        for (i, r) in out.iter().enumerate() {
            let n = r.expect("compressible");
            let back =
                miniz_oxide::inflate::decompress_to_vec(&dst[i * PAGE_SIZE..i * PAGE_SIZE + n])
                    .unwrap();
            assert_eq!(back, pages[i], "round {round} page {i}");
        }
    }
    let s = codec.stats();
    // Round 1: 8 descriptors time out and hold all 8 slots; round 2 finds
    // every slot stale and goes straight to software.
    assert_eq!((s.timeouts, s.sw_pages, s.hw_pages), (8, 16, 0), "{s:?}");

    let written = std::fs::read(&cdev).unwrap();
    assert_eq!(written.len(), 8 * DESC_SIZE);
    for chunk in written.chunks(DESC_SIZE) {
        let d = IaxHwDesc::from_bytes(chunk.try_into().unwrap());
        assert_eq!(d.opcode(), IAX_OPCODE_COMPRESS);
        assert_eq!(d.flags(), COMPRESS_DESC_FLAGS);
        assert_eq!(d.op_flags, IAA_COMP_FLAGS);
        assert_eq!(d.src1_size as usize, PAGE_SIZE);
        assert_eq!(d.max_dst_size, 3000);
        assert_eq!(d.src2_size as usize, AECS_COMP_SIZE);
        assert_eq!(d.completion_addr % 64, 0);
        assert_ne!(d.src1_addr, 0);
        assert_ne!(d.dst_addr, 0);
        assert_eq!(d.pasid_priv, 0);
    }
}
