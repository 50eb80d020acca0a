//! The IAA backend run against the software device model: round trips on
//! real memory pages, every injected fault recovered without data loss,
//! queue-full retries, overflow stored raw, in-flight bounds, and the
//! deflate format checked against an independent inflater.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use zblk::accel::desc::{IAA_ERROR_WATCHDOG_EXPIRED, IAX_OPCODE_COMPRESS, IAX_OPCODE_DECOMPRESS};
use zblk::accel::model::{Exec, Fault, ModelDevice, ModelWqConfig};
use zblk::accel::sysfs::WqMode;
use zblk::accel::Router;
use zblk::codec::{Algo, Codec};
use zblk::codec::{IaaCodec, IaaOptions};
use zblk::PAGE_SIZE;

const BUDGET: usize = 3072;

/// Default options with a timeout no scheduling delay on a loaded test
/// machine reaches: only the timeout test relies on timeouts.
fn opts() -> IaaOptions {
    IaaOptions {
        timeout: Duration::from_secs(20),
        ..IaaOptions::default()
    }
}

/// Waits (bounded) until `cond` holds; false if it never did.
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..20_000 {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

/// 96 real pages (the engine's fixture: pages 0-31 and 64-95 compress,
/// 32-63 do not fit a 3 KB budget; four are same-filled).
fn fixture_pages() -> Vec<Vec<u8>> {
    let z = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/realmem-96.bin.zst"),
    )
    .unwrap();
    let raw = zstd::decode_all(&z[..]).unwrap();
    assert_eq!(raw.len(), 96 * PAGE_SIZE);
    raw.chunks(PAGE_SIZE).map(|c| c.to_vec()).collect()
}

/// A model device with `wqs`, its fake sysfs, and a router found by
/// discovery over that sysfs.
struct Rig {
    model: ModelDevice,
    router: Router,
    _dir: tempfile::TempDir,
}

fn setup(exec: Exec, wqs: &[ModelWqConfig]) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelDevice::new(1, wqs, exec).unwrap();
    model.write_sysfs(dir.path()).unwrap();
    let router = Router::open(dir.path(), Path::new("/dev/iax"), &model.opener());
    assert_eq!(router.queues().len(), wqs.len(), "{:?}", router.why_none());
    Rig {
        model,
        router,
        _dir: dir,
    }
}

fn shared(size: u32) -> Vec<ModelWqConfig> {
    vec![ModelWqConfig::new("wq1.0", WqMode::Shared, size)]
}

/// Compresses `pages` in groups of 8 and returns per-page results and the
/// accel count; every page area is checked to decode back exactly.
fn compress_all(codec: &mut IaaCodec, pages: &[Vec<u8>]) -> (Vec<Option<Vec<u8>>>, usize) {
    let mut results = Vec::new();
    let mut accel = 0;
    for group in pages.chunks(8) {
        let refs: Vec<&[u8]> = group.iter().map(|p| p.as_slice()).collect();
        let mut dst = vec![0u8; group.len() * PAGE_SIZE];
        let mut out = Vec::new();
        accel += codec
            .compress_batch(&refs, &mut dst, BUDGET, &mut out)
            .unwrap();
        assert_eq!(out.len(), group.len());
        for (i, r) in out.iter().enumerate() {
            results.push(r.map(|n| dst[i * PAGE_SIZE..i * PAGE_SIZE + n].to_vec()));
        }
    }
    (results, accel)
}

/// Checks every compressed page inflates (with miniz_oxide, an independent
/// implementation, and with the codec) to the original, and every raw one
/// is really incompressible within the budget.
fn check(codec: &mut IaaCodec, pages: &[Vec<u8>], results: &[Option<Vec<u8>>]) {
    let mut sw = libdeflater::Compressor::new(libdeflater::CompressionLvl::new(1).unwrap());
    for (page, r) in pages.iter().zip(results) {
        match r {
            Some(c) => {
                assert!(c.len() <= BUDGET);
                let back = miniz_oxide::inflate::decompress_to_vec(c).unwrap();
                assert_eq!(&back, page);
                let mut out = vec![0u8; PAGE_SIZE];
                codec.decompress(c, &mut out).unwrap();
                assert_eq!(&out, page);
            }
            None => {
                let mut buf = vec![0u8; BUDGET];
                assert!(
                    sw.deflate_compress(page, &mut buf).is_err(),
                    "stored raw but compressible"
                );
            }
        }
    }
}

#[test]
fn real_pages_round_trip_through_the_device() {
    let rig = setup(Exec::Inline, &shared(16));
    let mut codec = IaaCodec::with_router(&rig.router, opts());
    assert!(codec.uses_hardware());
    let pages = fixture_pages();
    let (results, accel) = compress_all(&mut codec, &pages);
    check(&mut codec, &pages, &results);
    let s = codec.stats();
    assert_eq!(accel, 96, "{s:?}");
    assert_eq!(s.sw_pages, 0);
    assert_eq!(s.hw_overflow, 32, "the incompressible run overflows: {s:?}");
    assert_eq!(s.hw_pages, 64);
    let m = rig.model.stats();
    assert_eq!(m.compress, 96);
    // 64 verify decompresses, then 64 decompresses by `check`.
    assert_eq!(m.decompress, 128, "{m:?}");
    assert_eq!(s.hw_decompress, 64);
    assert_eq!(m.dropped + m.bad_completion, 0);
}

#[test]
fn asynchronous_queues_bound_in_flight_and_spread_work() {
    let wqs = [
        ModelWqConfig::new("wq1.0", WqMode::Dedicated, 2),
        ModelWqConfig::new("wq1.1", WqMode::Shared, 3),
    ];
    let rig = setup(Exec::Thread, &wqs);
    rig.model.set_latency(Duration::from_micros(30));
    let router = Arc::new(rig.router);
    let pages = Arc::new(fixture_pages());
    // Two queue threads share the process's work queues, as in the engine.
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (router, pages) = (router.clone(), pages.clone());
            std::thread::spawn(move || {
                let mut codec = IaaCodec::with_router(&router, opts());
                let (results, accel) = compress_all(&mut codec, &pages);
                check(&mut codec, &pages, &results);
                (accel, codec.stats())
            })
        })
        .collect();
    for h in handles {
        let (accel, s) = h.join().unwrap();
        assert_eq!(accel as u64, s.hw_pages + s.hw_overflow);
        assert_eq!(s.timeouts + s.device_errors + s.verify_failures, 0, "{s:?}");
    }
    let m = rig.model.stats();
    assert_eq!(m.dropped, 0, "a dedicated WQ was overfilled: {m:?}");
    let q = router.queues();
    assert!(
        q.iter()
            .all(|q| q.submitted.load(std::sync::atomic::Ordering::Relaxed) > 0),
        "work not spread"
    );
}

#[test]
fn a_group_keeps_eight_descriptors_in_flight() {
    // A paused engine completes nothing: the codec must have all 8
    // descriptors of the group queued (the kernel's IAA batch size).
    let rig = setup(Exec::Thread, &shared(16));
    rig.model.pause(true);
    let pages = fixture_pages()[64..72].to_vec();
    let router = &rig.router;
    std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            let mut codec = IaaCodec::with_router(router, opts());
            let (results, accel) = compress_all(&mut codec, &pages);
            check(&mut codec, &pages, &results);
            accel
        });
        assert!(
            eventually(|| rig.model.stats().accepted == 8),
            "{:?}",
            rig.model.stats()
        );
        assert_eq!(rig.model.stats().peak_occupancy, 8);
        rig.model.pause(false);
        assert_eq!(h.join().unwrap(), 8);
    });

    // A dedicated WQ of 2 entries never holds more than 2, and no posted
    // descriptor is lost, while the group still all goes to the device.
    let ded = setup(
        Exec::Thread,
        &[ModelWqConfig::new("wq1.0", WqMode::Dedicated, 2)],
    );
    ded.model.set_latency(Duration::from_micros(500));
    let mut codec = IaaCodec::with_router(&ded.router, opts());
    let pages = fixture_pages()[64..80].to_vec();
    let (results, accel) = compress_all(&mut codec, &pages);
    assert_eq!(accel, 16, "{:?} {:?}", codec.stats(), ded.model.stats());
    let m = ded.model.stats();
    assert_eq!((m.peak_occupancy, m.dropped), (2, 0), "{m:?}");
    check(&mut codec, &pages, &results);
}

/// Runs one group of 8 real compressible pages with `fault` injected into
/// the first compress descriptor; returns the codec stats after checking
/// all data.
fn one_fault(fault: Fault, opts: IaaOptions, exec: Exec) -> (zblk::codec::IaaStats, Rig) {
    let rig = setup(exec, &shared(16));
    rig.model.inject(Some(IAX_OPCODE_COMPRESS), fault);
    let mut codec = IaaCodec::with_router(&rig.router, opts);
    let pages: Vec<Vec<u8>> = fixture_pages()[24..32].to_vec();
    let (results, _) = compress_all(&mut codec, &pages);
    check(&mut codec, &pages, &results);
    assert!(
        results.iter().all(|r| r.is_some()),
        "compressible pages stored raw"
    );
    (codec.stats(), rig)
}

#[test]
fn page_fault_redoes_the_page_in_software() {
    let (s, rig) = one_fault(Fault::PageFault, opts(), Exec::Inline);
    assert_eq!((s.page_faults, s.sw_pages, s.hw_pages), (1, 1, 7), "{s:?}");
    assert_eq!(rig.model.stats().faults, 1);
}

#[test]
fn corrupt_output_is_caught_by_verify() {
    let (s, _rig) = one_fault(Fault::CorruptOutput, opts(), Exec::Inline);
    assert_eq!(
        (s.verify_failures, s.sw_pages, s.hw_pages),
        (1, 1, 7),
        "{s:?}"
    );
}

#[test]
fn watchdog_and_other_errors_redo_in_software() {
    let (s, _rig) = one_fault(
        Fault::Status(IAA_ERROR_WATCHDOG_EXPIRED),
        opts(),
        Exec::Inline,
    );
    assert_eq!(
        (s.device_errors, s.sw_pages, s.hw_pages),
        (1, 1, 7),
        "{s:?}"
    );
}

#[test]
fn timeout_redoes_in_software_and_quarantines_the_slot() {
    // A dedicated WQ whose engine stalls: every descriptor times out, its
    // page is redone in software, and its slot and credit stay held until
    // the late completion arrives; then the same codec gets them back.
    let rig = setup(
        Exec::Thread,
        &[ModelWqConfig::new("wq1.0", WqMode::Dedicated, 8)],
    );
    rig.model.pause(true);
    let opts = IaaOptions {
        timeout: Duration::from_millis(5),
        ..opts()
    };
    let mut codec = IaaCodec::with_router(&rig.router, opts);
    let pages = fixture_pages()[24..32].to_vec();
    let (results, accel) = compress_all(&mut codec, &pages);
    assert_eq!(accel, 0);
    let s = codec.stats();
    assert_eq!((s.timeouts, s.sw_pages, s.hw_pages), (8, 8, 0), "{s:?}");
    // While stuck, decompression goes to software too (no free slot).
    check(&mut codec, &pages, &results);
    assert_eq!(codec.stats().hw_decompress, 0);

    rig.model.pause(false);
    assert!(eventually(|| rig.model.stats().compress == 8));
    codec.set_timeout(Duration::from_secs(20));
    let (results, accel) = compress_all(&mut codec, &pages);
    check(&mut codec, &pages, &results);
    assert_eq!(
        accel,
        8,
        "stale slots and credits were not reclaimed: {:?}",
        codec.stats()
    );
    assert_eq!(codec.stats().timeouts, 8);
    assert_eq!(rig.model.stats().dropped, 0);
}

#[test]
fn late_completion_after_drop_lands_in_leaked_buffers() {
    // The codec is dropped while its descriptors are stuck: it must leak
    // their buffers rather than free memory the device will still write.
    let rig = setup(Exec::Thread, &shared(16));
    rig.model.inject(
        Some(IAX_OPCODE_COMPRESS),
        Fault::Delay(Duration::from_millis(30)),
    );
    rig.model.pause(true);
    {
        let mut codec = IaaCodec::with_router(
            &rig.router,
            IaaOptions {
                timeout: Duration::from_millis(2),
                ..opts()
            },
        );
        let pages = fixture_pages()[24..32].to_vec();
        let (results, _) = compress_all(&mut codec, &pages);
        check(&mut codec, &pages, &results);
        assert_eq!(codec.stats().timeouts, 8);
    }
    rig.model.pause(false);
    assert!(eventually(|| rig.model.stats().compress == 8));
    assert_eq!(rig.model.stats().faults, 1);
}

#[test]
fn overflow_means_store_raw() {
    let rig = setup(Exec::Inline, &shared(16));
    rig.model.inject(Some(IAX_OPCODE_COMPRESS), Fault::Overflow);
    let mut codec = IaaCodec::with_router(&rig.router, opts());
    let pages = fixture_pages()[24..32].to_vec();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    let mut dst = vec![0u8; 8 * PAGE_SIZE];
    let mut out = Vec::new();
    let accel = codec
        .compress_batch(&refs, &mut dst, BUDGET, &mut out)
        .unwrap();
    assert_eq!(accel, 8);
    assert_eq!(out[0], None, "device overflow must mean store raw");
    assert!(out[1..].iter().all(|r| r.is_some()));
    assert_eq!(codec.stats().hw_overflow, 1);
}

#[test]
fn queue_full_is_retried_then_falls_back() {
    let rig = setup(Exec::Inline, &shared(16));
    rig.model.reject_next(5);
    let mut codec = IaaCodec::with_router(&rig.router, opts());
    let pages = fixture_pages()[24..32].to_vec();
    let (results, accel) = compress_all(&mut codec, &pages);
    check(&mut codec, &pages, &results);
    assert_eq!(accel, 8, "5 retries fit in the retry budget");
    assert_eq!(rig.model.stats().retries, 5);
    assert_eq!(
        rig.router.queues()[0]
            .retries
            .load(std::sync::atomic::Ordering::Relaxed),
        5
    );

    // A queue that stays full: every page goes to software, none is lost.
    let opts = IaaOptions {
        enqcmd_retries: 3,
        ..opts()
    };
    let mut codec = IaaCodec::with_router(&rig.router, opts);
    rig.model.reject_next(u32::MAX);
    let (results, accel) = compress_all(&mut codec, &pages);
    rig.model.reject_next(0);
    check(&mut codec, &pages, &results);
    assert_eq!(accel, 0);
    let s = codec.stats();
    assert_eq!((s.submit_failures, s.sw_pages), (8, 8), "{s:?}");
}

#[test]
fn verify_off_submits_no_decompress() {
    let rig = setup(Exec::Inline, &shared(16));
    let opts = IaaOptions {
        verify: false,
        ..opts()
    };
    let mut codec = IaaCodec::with_router(&rig.router, opts);
    let pages = fixture_pages()[24..32].to_vec();
    let (_results, accel) = compress_all(&mut codec, &pages);
    assert_eq!(accel, 8);
    assert_eq!(rig.model.stats().decompress, 0);
}

#[test]
fn decompress_falls_back_to_software() {
    let rig = setup(Exec::Inline, &shared(16));
    let mut codec = IaaCodec::with_router(&rig.router, opts());
    let page = &fixture_pages()[30];
    let mut c = vec![0u8; BUDGET];
    let n = codec.compress(page, &mut c).unwrap().unwrap();
    assert_eq!(
        codec.stats().hw_pages,
        1,
        "single-page compress goes to the device"
    );
    rig.model
        .inject(Some(IAX_OPCODE_DECOMPRESS), Fault::PageFault);
    let mut out = vec![0u8; PAGE_SIZE];
    codec.decompress(&c[..n], &mut out).unwrap();
    assert_eq!(&out, page);
    let s = codec.stats();
    assert_eq!((s.hw_decompress, s.sw_decompress), (0, 1), "{s:?}");
    // Corrupt input stays an error, not a panic, on both paths.
    assert!(codec.decompress(&[0xff; 64], &mut out).is_err());
}

#[test]
fn no_device_means_software_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelDevice::new(1, &[], Exec::Inline).unwrap();
    let router = Router::open(dir.path(), Path::new("/dev/iax"), &model.opener());
    assert!(router.why_none().unwrap().contains("no iax device"));
    let mut codec = IaaCodec::with_router(&router, opts());
    assert!(!codec.uses_hardware());
    let pages = fixture_pages();
    let (results, accel) = compress_all(&mut codec, &pages);
    check(&mut codec, &pages, &results);
    assert_eq!(accel, 0);
    assert_eq!(codec.stats().sw_pages, 96);
    // The engine's entry point gives the routed codec too.
    assert_eq!(Algo::DeflateIaa.new_codec().algo(), Algo::DeflateIaa);
}

#[test]
fn independent_deflate_streams_decode_on_both_paths() {
    let rig = setup(Exec::Inline, &shared(16));
    let mut hw = IaaCodec::with_router(&rig.router, opts());
    let dir = tempfile::tempdir().unwrap();
    let none = Router::open(dir.path(), Path::new("/dev/iax"), &rig.model.opener());
    let mut sw = IaaCodec::with_router(&none, opts());
    for page in fixture_pages().iter().step_by(5) {
        // miniz_oxide raw deflate (window limited to the 4 KB page).
        let c = miniz_oxide::deflate::compress_to_vec(page, 6);
        for codec in [&mut hw, &mut sw] {
            let mut out = vec![0u8; PAGE_SIZE];
            codec.decompress(&c, &mut out).unwrap();
            assert_eq!(&out, page);
        }
    }
    assert!(hw.stats().hw_decompress > 0);
    assert_eq!(sw.stats().hw_decompress, 0);
}

#[test]
fn store_with_deflate_iaa_round_trips_in_both_modes() {
    use zblk::Mode;
    use zblk::{Store, StoreConfig};
    let pages = fixture_pages();
    let data: Vec<u8> = pages.concat();
    for mode in [Mode::PerPage, Mode::Packed] {
        let mut cfg = StoreConfig::new(data.len() as u64);
        cfg.algo = Algo::DeflateIaa;
        cfg.mode = mode;
        let store = Store::new(cfg).unwrap();
        let mut ctx = store.new_ctx();
        ctx.write(0, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        ctx.read(0, &mut back).unwrap();
        assert!(back == data, "{mode:?}");
        if Router::global().queues().is_empty() {
            // No IAA here: every compressed page is a software page.
            assert_eq!(store.stats().counters.accel_pages, 0);
        }
    }
}

/// A store whose queue contexts compress on the device model: pages the
/// device compressed count as `accel_pages`, a page fault and a corrupt
/// output show up in `zblk stat`'s accelerator counters, the device's
/// decompressions too, and every page reads back intact.
#[test]
fn store_counts_accelerator_pages_and_fallbacks() {
    use zblk::{CodecFactory, Mode};
    use zblk::{Store, StoreConfig};
    let rig = setup(Exec::Inline, &shared(16));
    let router = Arc::new(rig.router);
    let data: Vec<u8> = fixture_pages().concat();
    let mut cfg = StoreConfig::new(data.len() as u64);
    cfg.algo = Algo::DeflateIaa;
    cfg.mode = Mode::PerPage;
    let r = router.clone();
    cfg.codecs = Some(CodecFactory(Arc::new(move || {
        Box::new(IaaCodec::with_router(&r, opts())) as Box<dyn Codec>
    })));
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.new_ctx();
    rig.model
        .inject(Some(IAX_OPCODE_COMPRESS), Fault::PageFault);
    ctx.write(0, &data[..8 * PAGE_SIZE]).unwrap();
    rig.model
        .inject(Some(IAX_OPCODE_COMPRESS), Fault::CorruptOutput);
    ctx.write(8 * PAGE_SIZE as u64, &data[8 * PAGE_SIZE..])
        .unwrap();
    let mut back = vec![0u8; data.len()];
    ctx.read(0, &mut back).unwrap();
    assert!(back == data, "a page did not read back");
    let c = store.stats().counters;
    assert_eq!(
        (c.accel_page_faults, c.accel_verify_failures),
        (1, 1),
        "{c:?}"
    );
    assert_eq!(
        c.accel_timeouts + c.accel_device_errors + c.accel_submit_failures,
        0
    );
    // 96 pages: 4 same-filled, 2 redone in software, 90 through the device,
    // 32 of which did not fit the budget (stored raw); the device
    // decompresses every compressed page, software-made ones included.
    assert_eq!(
        (c.same_pages, c.sw_pages, c.accel_pages),
        (4, 2, 90),
        "{c:?}"
    );
    assert_eq!(c.huge_pages, 32, "{c:?}");
    assert_eq!(c.accel_decompressed, 60, "{c:?}");
    // A factory that makes another algorithm's codecs is refused.
    let mut bad = StoreConfig::new(data.len() as u64);
    bad.algo = Algo::Lz4;
    bad.codecs = Some(CodecFactory(Arc::new(move || {
        Box::new(IaaCodec::with_router(&router, opts())) as Box<dyn Codec>
    })));
    assert!(Store::new(bad).is_err());
}
