//! Phase timers (`StoreConfig::phase_timers`): the per-page breakdown the
//! benchmarks read. Each phase is part of its request's time, every phase
//! the path took is counted, and a store without timers reports none.

use zblk::{Algo, Mode, Store, StoreConfig, PAGE_SIZE};

const PAGES: usize = 64;

/// Pages that compress (text-like, each its own) but are not same-filled.
fn pages() -> Vec<u8> {
    (0..PAGES * PAGE_SIZE)
        .map(|i| b"zblk phase timers "[i % 18] ^ ((i / PAGE_SIZE) as u8))
        .collect()
}

fn store(mode: Mode, timers: bool) -> std::sync::Arc<Store> {
    let cfg = StoreConfig {
        algo: Algo::Lz4,
        mode,
        phase_timers: timers,
        ..StoreConfig::new((PAGES * PAGE_SIZE * 2) as u64)
    };
    Store::new(cfg).unwrap()
}

fn exercise(s: &std::sync::Arc<Store>) {
    let data = pages();
    let mut ctx = s.new_ctx();
    // Multi-page requests (groups) and single pages.
    ctx.write(0, &data[..32 * PAGE_SIZE]).unwrap();
    for p in 32..PAGES {
        ctx.write(
            (p * PAGE_SIZE) as u64,
            &data[p * PAGE_SIZE..(p + 1) * PAGE_SIZE],
        )
        .unwrap();
    }
    let mut back = vec![0u8; data.len()];
    ctx.read(0, &mut back).unwrap();
    assert_eq!(back, data);
    ctx.discard(0, (8 * PAGE_SIZE) as u64).unwrap();
}

#[test]
fn every_phase_is_part_of_its_request() {
    for mode in [Mode::PerPage, Mode::Packed] {
        let s = store(mode, true);
        exercise(&s);
        let st = s.stats();
        let p = st.phases.clone().expect("phase timers on: phases reported");
        let parts = p.compress_ns + p.alloc_ns + p.copy_ns + p.install_ns;
        assert!(
            p.compress_ns > 0 && p.alloc_ns > 0 && p.copy_ns > 0 && p.install_ns > 0,
            "{mode:?}: {p:?}"
        );
        assert!(
            parts <= p.write_ns,
            "{mode:?}: phases {parts} ns > writes {} ns",
            p.write_ns
        );
        assert!(
            p.decode_ns > 0 && p.decode_ns <= p.read_ns,
            "{mode:?}: {p:?}"
        );
        assert!(p.discard_ns > 0, "{mode:?}: {p:?}");
        let json = serde_json::to_value(&st).unwrap();
        assert!(json["phases"]["compress_ns"].as_u64().unwrap() > 0);
    }
}

#[test]
fn without_timers_no_phases_are_reported() {
    let s = store(Mode::PerPage, false);
    exercise(&s);
    let st = s.stats();
    assert!(st.phases.is_none());
    let json = serde_json::to_value(&st).unwrap();
    assert!(json.get("phases").is_none());
}
