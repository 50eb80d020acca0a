use super::*;
use crate::page::PAGE_SIZE;
use crate::testing::OwnerTable as Table;

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) >> 1) as u8)
        .collect()
}

/// Fills a fresh object of `len` bytes with the pattern of `seed`.
fn fill(a: &SlabAllocator, h: Handle, len: usize, seed: u64) {
    // SAFETY: `h` is fresh from alloc_bulk with at least `len` bytes, and
    // only this test thread knows it.
    unsafe { a.write_fresh(h, 0, &pattern(len, seed)) };
}

fn check(a: &SlabAllocator, h: Handle, len: usize, seed: u64) {
    // SAFETY: `h` is live with at least `len` bytes; nothing writes it now.
    let obj = unsafe { a.bytes(h, 0, len) };
    for (i, (&b, want)) in obj.iter().zip(pattern(len, seed)).enumerate() {
        assert_eq!(b, want, "handle {h:#x} byte {i} seed {seed}");
    }
}

/// Fills fresh objects `hs` of `len` bytes with their index's pattern,
/// then checks them all.
fn fill_then_check(a: &SlabAllocator, hs: &[Handle], len: usize) {
    for (i, &h) in hs.iter().enumerate() {
        fill(a, h, len, i as u64);
    }
    for (i, &h) in hs.iter().enumerate() {
        check(a, h, len, i as u64);
    }
}

#[test]
fn handles_round_trip() {
    for (c, id, idx) in [(0, 0, 0), (254, MAX_ID - 1, 4095), (17, 123_456, 1023)] {
        let h = handle(c, id, idx);
        assert_ne!(h, 0);
        assert_eq!(unpack(h), (c, id, idx));
    }
    assert_eq!(unpack(0).0, usize::MAX);
}

/// Every class, every zspage length: fill two zspages and one more object
/// with full-size objects, check bytes, straddling and accounting, free.
#[test]
fn every_class_stores_full_objects_including_straddling_ones() {
    let a = SlabAllocator::default();
    let mut lengths_seen = [false; class::MAX_ZSPAGE_PAGES + 1];
    for (c, spec) in a.class_specs().to_vec().into_iter().enumerate() {
        if c < a.table.first_large {
            lengths_seen[spec.pages as usize] = true;
        }
        let size = spec.size as usize;
        let n = 2 * spec.objs as usize + 1;
        let sizes = vec![spec.size; n];
        let owners: Vec<u64> = (0..n as u64).collect();
        let mut hs = Vec::new();
        a.alloc_bulk(&sizes, &owners, &mut hs).unwrap();
        assert_eq!(hs.len(), n);
        let mut straddling = 0;
        for (i, &h) in hs.iter().enumerate() {
            assert_eq!(SlabAllocator::class_of_handle(h), c);
            // SAFETY: a live handle of `size` bytes; only its address is taken.
            let p = unsafe { a.object_ptr(h, size) } as usize;
            if p % PAGE_SIZE + size > PAGE_SIZE {
                straddling += 1;
            }
            fill(&a, h, size, i as u64 + 1000 * c as u64);
        }
        for (i, &h) in hs.iter().enumerate() {
            check(&a, h, size, i as u64 + 1000 * c as u64);
        }
        if spec.pages > 1 && PAGE_SIZE % size != 0 {
            assert!(straddling > 0, "class {spec:?} has no straddling object");
        }
        assert_eq!(a.zspages(), 3, "class {spec:?}");
        assert_eq!(a.mem_used_total(), 3 * a.classes[c].cost);
        a.free_bulk(&hs);
        assert_eq!(a.zspages(), 0);
        assert_eq!(a.mem_used_total(), 0, "class {spec:?}");
    }
    for (pages, seen) in lengths_seen.iter().enumerate().skip(1) {
        // The small classes use every length from 1 to 8 pages, so every
        // zspage length was exercised above.
        assert!(seen, "no class uses {pages}-page zspages");
    }
}

#[test]
fn every_object_size_round_trips() {
    let a = SlabAllocator::default();
    let mut sizes: Vec<u32> = (1..=PAGE_SIZE as u32).collect();
    // And objects larger than a page (packed groups), up to the largest.
    sizes.extend((1..=65u32).map(|p| p * PAGE_SIZE as u32 - 7 * p));
    sizes.push(class::MAX_OBJ as u32);
    let owners: Vec<u64> = (0..sizes.len() as u64).collect();
    let mut hs = Vec::new();
    a.alloc_bulk(&sizes, &owners, &mut hs).unwrap();
    for (&h, &s) in hs.iter().zip(&sizes) {
        fill(&a, h, s as usize, s as u64);
    }
    for (&h, &s) in hs.iter().zip(&sizes) {
        check(&a, h, s as usize, s as u64);
    }
    let peak = a.mem_used_total();
    assert_eq!(a.mem_used_max(), peak);
    a.free_bulk(&hs);
    assert_eq!(a.mem_used_total(), 0);
    assert_eq!(a.mem_used_max(), peak);
    a.reset_mem_used_max();
    assert_eq!(a.mem_used_max(), 0);
}

#[test]
fn freed_objects_and_zspages_are_reused() {
    let a = SlabAllocator::default();
    let mut hs = Vec::new();
    a.alloc_bulk(&[100; 40], &[0; 40], &mut hs).unwrap();
    let zs = a.zspages();
    let mem = a.mem_used_total();
    a.free_bulk(&hs[..20]);
    let mut more = Vec::new();
    a.alloc_bulk(&[100; 20], &[0; 20], &mut more).unwrap();
    assert_eq!(a.zspages(), zs, "holes are filled before new zspages");
    assert_eq!(a.mem_used_total(), mem);
    a.free_bulk(&hs[20..]);
    a.free_bulk(&more);
    assert_eq!(a.mem_used_total(), 0);
    // Dead ids and their address ranges come back.
    let mut again = Vec::new();
    a.alloc_bulk(&[100; 40], &[0; 40], &mut again).unwrap();
    for (i, &h) in again.iter().enumerate() {
        fill(&a, h, 100, i as u64);
    }
    for (i, &h) in again.iter().enumerate() {
        check(&a, h, 100, i as u64);
    }
    a.free_bulk(&again);
}

#[test]
fn limit_refuses_whole_bulk_and_keeps_nothing() {
    let a = SlabAllocator::default();
    let cost4k = a.classes[a.class_of(4096).unwrap()].cost;
    a.set_mem_limit(3 * cost4k);
    assert_eq!(a.mem_limit(), 3 * cost4k);
    let mut hs = vec![42];
    // Mixed classes: the small ones succeed first and must be rolled back.
    let err = a
        .alloc_bulk(
            &[100, 4096, 200, 4096, 4096, 4096],
            &[0, 1, 2, 3, 4, 5],
            &mut hs,
        )
        .unwrap_err();
    assert_eq!(err.limit, 3 * cost4k);
    assert_eq!(hs, vec![42], "out unchanged");
    assert_eq!(a.mem_used_total(), 0);
    assert_eq!(a.objects(), 0);
    a.alloc_bulk(&[4096, 4096, 4096], &[0, 1, 2], &mut hs)
        .unwrap();
    assert_eq!(a.mem_used_total(), 3 * cost4k);
    a.set_mem_limit(0);
    a.alloc_bulk(&[4096], &[3], &mut hs).unwrap();
    a.free_bulk(&hs[1..]);
    assert_eq!(a.mem_used_total(), 0);
}

#[test]
fn bad_sizes_and_double_frees_are_errors_not_panics() {
    let a = SlabAllocator::default();
    let mut hs = Vec::new();
    assert!(a
        .alloc_bulk(&[class::MAX_OBJ as u32 + 1], &[0], &mut hs)
        .is_err());
    assert!(a.alloc_bulk(&[10, 10], &[0], &mut hs).is_err());
    assert!(hs.is_empty());
    a.alloc_bulk(&[10, 10], &[0, 1], &mut hs).unwrap();
    a.free_bulk(&hs[..1]);
    a.free_bulk(&hs[..1]); // double free: logged, ignored
    a.free_bulk(&[0, u64::MAX, handle(3, 999, 0)]);
    assert_eq!(a.objects(), 1);
    check_untouched_after_bad_frees(&a, hs[1]);
    a.free_bulk(&hs[1..]);
    assert_eq!(a.mem_used_total(), 0);
}

fn check_untouched_after_bad_frees(a: &SlabAllocator, h: Handle) {
    fill(a, h, 10, 5);
    check(a, h, 10, 5);
}

#[test]
fn compaction_moves_objects_and_frees_zspages() {
    let a = SlabAllocator::default();
    let size = 1000u32;
    let c = a.class_of(size as usize).unwrap();
    let objs = a.class_specs()[c].objs as usize;
    let n = objs * 20;
    let table = Table::new(n);
    let mut hs = Vec::new();
    let owners: Vec<u64> = (0..n as u64).collect();
    a.alloc_bulk(&vec![size; n], &owners, &mut hs).unwrap();
    for (i, &h) in hs.iter().enumerate() {
        *table.0[i].lock().unwrap() = h;
        fill(&a, h, size as usize, i as u64);
    }
    // Free all but one object of every zspage: 20 zspages, 19 freeable.
    let (keep, drop_): (Vec<_>, Vec<_>) = (0..n).partition(|i| i % objs == 0);
    let dropped: Vec<Handle> = drop_.iter().map(|&i| hs[i]).collect();
    for &i in &drop_ {
        *table.0[i].lock().unwrap() = 0;
    }
    a.free_bulk(&dropped);
    assert_eq!(a.zspages(), 20);
    let pages = a.class_specs()[c].pages as u64;
    assert_eq!(
        a.compactable_pages(),
        (20 - 20usize.div_ceil(objs)) as u64 * pages
    );
    let before = a.mem_used_total();
    let freed = a.compact(&table);
    assert_eq!(a.zspages(), 20usize.div_ceil(objs) as u64);
    assert_eq!(freed, (20 - a.zspages()) * pages);
    assert!(a.mem_used_total() < before);
    assert_eq!(a.compactable_pages(), 0);
    for &i in &keep {
        let h = *table.0[i].lock().unwrap();
        check(&a, h, size as usize, i as u64);
    }
    let live: Vec<Handle> = keep.iter().map(|&i| *table.0[i].lock().unwrap()).collect();
    a.free_bulk(&live);
    assert_eq!(a.mem_used_total(), 0);
}

#[test]
fn compaction_skips_objects_their_slot_no_longer_holds() {
    let a = SlabAllocator::default();
    let table = Table::new(8);
    let mut hs = Vec::new();
    // Two 1-page zspages of 4 objects of 1000 bytes (class 1008 or so).
    let c = a.class_of(1000).unwrap();
    let objs = a.class_specs()[c].objs as usize;
    let n = 2 * objs;
    a.alloc_bulk(&vec![1000; n], &(0..n as u64).collect::<Vec<_>>(), &mut hs)
        .unwrap();
    // Slot 0 keeps its object; everything else in zspage 0 is freed; in
    // zspage 1 only one object is live but its slot was detached (pending
    // free): compaction must leave it alone.
    *table.0[0].lock().unwrap() = hs[0];
    fill(&a, hs[0], 1000, 1);
    a.free_bulk(&hs[1..objs]);
    a.free_bulk(&hs[objs + 1..]);
    let pending = hs[objs];
    let pages = a.class_specs()[c].pages as u64;
    // The pending object stays where it is; the live one moves next to it
    // (whichever zspage compaction tries first), and its zspage is freed.
    assert_eq!(a.compact(&table), pages);
    assert_eq!(a.zspages(), 1);
    let moved = *table.0[0].lock().unwrap();
    assert_ne!(moved, hs[0]);
    check(&a, moved, 1000, 1);
    // With only the pending object's zspage and nothing live, nothing moves.
    *table.0[0].lock().unwrap() = 0;
    assert_eq!(a.compact(&table), 0);
    a.free_bulk(&[pending, moved]);
    assert_eq!(a.mem_used_total(), 0);
}

#[test]
fn mlock_config_works_or_degrades() {
    // Whether mlock succeeds depends on RLIMIT_MEMLOCK; either way objects
    // must be stored and freed correctly.
    let a = SlabAllocator::new(SlabConfig {
        mlock: true,
        ..SlabConfig::default()
    });
    let mut hs = Vec::new();
    a.alloc_bulk(&[3000; 10], &[0; 10], &mut hs).unwrap();
    fill_then_check(&a, &hs, 3000);
    a.free_bulk(&hs);
    assert_eq!(a.mem_used_total(), 0);
}

/// The `Locked:` kB /proc/self/smaps shows for the mapping holding `addr`.
fn locked_kb_at(addr: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = head.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        if let Some(kb) = line.strip_prefix("Locked:").filter(|_| inside) {
            return kb.trim().trim_end_matches("kB").trim().parse().unwrap();
        }
    }
    panic!("no mapping holds {addr:#x}");
}

#[test]
fn mlocked_zspages_are_locked_while_live() {
    if !vm::may_lock_unbounded() {
        eprintln!("skipped: this process may not lock unlimited memory");
        return;
    }
    let cfg = SlabConfig {
        mlock: true,
        ..SlabConfig::default()
    };
    let shm = Arc::new(crate::shm::SharedMem::create(false).unwrap());
    for a in [SlabAllocator::new(cfg), SlabAllocator::shared(cfg, shm)] {
        let mut hs = Vec::new();
        // 40 objects of 3000 bytes: several zspages, backed in one run.
        a.alloc_bulk(&[3000; 40], &[0; 40], &mut hs).unwrap();
        // SAFETY: a live handle's object address, only looked at.
        let addr = unsafe { a.object_ptr(hs[0], 3000) } as usize;
        assert!(locked_kb_at(addr) >= 40 * 3000 / 1024, "zspages locked");
        fill_then_check(&a, &hs, 3000);
        a.free_bulk(&hs);
        assert_eq!(a.mem_used_total(), 0);
        // Given back: nothing of the chunk stays locked, but it is still
        // locked on fault (a new zspage there is locked by backing it).
        assert!(locked_kb_at(addr) < 40 * 3000 / 1024, "pages given back");
        a.alloc_bulk(&[3000; 40], &[0; 40], &mut hs).unwrap();
        assert!(
            locked_kb_at(addr) >= 40 * 3000 / 1024,
            "reused zspages locked"
        );
        a.free_bulk(&hs);
    }
}

#[test]
fn concurrent_alloc_free_across_classes() {
    let a = std::sync::Arc::new(SlabAllocator::default());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut live: Vec<(Handle, usize, u64)> = Vec::new();
                let mut x = t * 7919 + 1;
                for round in 0..300u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let sizes: Vec<u32> =
                        (0..8).map(|k| ((x >> (k * 8)) % 4096 + 1) as u32).collect();
                    let mut hs = Vec::new();
                    a.alloc_bulk(&sizes, &[0; 8], &mut hs).unwrap();
                    for (k, (&h, &s)) in hs.iter().zip(&sizes).enumerate() {
                        let seed = round * 8 + k as u64 + t * 1_000_000;
                        fill(&a, h, s as usize, seed);
                        live.push((h, s as usize, seed));
                    }
                    if live.len() > 40 {
                        let gone: Vec<_> = live.drain(..20).collect();
                        for &(h, s, seed) in &gone {
                            check(&a, h, s, seed);
                        }
                        a.free_bulk(&gone.iter().map(|e| e.0).collect::<Vec<_>>());
                    }
                }
                for &(h, s, seed) in &live {
                    check(&a, h, s, seed);
                }
                a.free_bulk(&live.iter().map(|e| e.0).collect::<Vec<_>>());
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(a.mem_used_total(), 0);
    assert_eq!(a.objects(), 0);
}

/// An emptied zspage of a class that still holds objects is kept as a
/// spare (charged, pages kept) and is what the next new zspage reuses; the
/// idle trim gives back spares that saw no reuse, compaction gives back
/// all of them, and a class that empties keeps none.
#[test]
fn emptied_zspages_are_kept_as_spares_then_trimmed() {
    let a = SlabAllocator::default();
    let c = a.class_of(1000).unwrap();
    let objs = a.classes[c].spec.objs as usize;
    let cost = a.classes[c].cost;
    let alloc = |n: usize| {
        let mut hs = Vec::new();
        a.alloc_bulk(&vec![1000; n], &vec![0; n], &mut hs).unwrap();
        hs
    };
    let keep = alloc(objs); // zspage 0 stays in use
    let second = alloc(objs); // zspage 1, emptied next
    assert_eq!(a.mem_used_total(), 2 * cost);
    a.free_bulk(&second);
    assert_eq!(a.zspages(), 1);
    assert_eq!(
        a.mem_used_total(),
        2 * cost,
        "the emptied zspage is a spare"
    );
    assert_eq!(a.spare_pages(), a.classes[c].spec.pages as u64);
    let again = alloc(objs);
    assert_eq!(a.mem_used_total(), 2 * cost, "the spare was reused");
    assert_eq!(a.spare_pages(), 0);
    assert_eq!(unpack(again[0]).1, unpack(second[0]).1, "same zspage id");
    fill(&a, again[0], 1000, 7);
    check(&a, again[0], 1000, 7);
    a.free_bulk(&again);
    // Reused since the last trim: kept once, given back the next time.
    assert_eq!(a.trim(), 0);
    assert_eq!(a.mem_used_total(), 2 * cost);
    assert_eq!(a.trim(), a.classes[c].spec.pages as u64);
    assert_eq!(a.mem_used_total(), cost);
    // Compaction gives spares back at once.
    let third = alloc(objs);
    a.free_bulk(&third);
    assert_eq!(a.mem_used_total(), 2 * cost);
    let table = Table::new(0);
    assert_eq!(a.compact(&table), a.classes[c].spec.pages as u64);
    assert_eq!(a.mem_used_total(), cost);
    // A class left with no objects keeps no spare.
    let fourth = alloc(objs);
    a.free_bulk(&fourth);
    a.free_bulk(&keep);
    assert_eq!(a.mem_used_total(), 0);
}

fn reserve_slab() -> SlabAllocator {
    SlabAllocator::new(SlabConfig {
        reserve: true,
        reserve_free_below: u64::MAX,
        ..SlabConfig::default()
    })
}

/// One provisioning pass over every class, as the provisioner runs it.
fn provision_all(a: &SlabAllocator) {
    for class in a.classes.iter() {
        a.provision(class);
    }
}

/// Without the provisioner, a reserve-mode slab makes no zspage itself:
/// the allocation fails after its bounded waits, is counted, and holds no
/// memory; once a pass ran for the class that missed, it succeeds.
#[test]
fn reserve_refuses_without_provisioner_then_serves_from_spares() {
    let a = reserve_slab();
    let mut hs = Vec::new();
    let t = std::time::Instant::now();
    assert_eq!(
        a.alloc_bulk(&[1000; 3], &[1, 2, 3], &mut hs),
        Err(AllocError { limit: 0 })
    );
    assert!(
        t.elapsed() < std::time::Duration::from_secs(2),
        "bounded wait"
    );
    assert!(hs.is_empty());
    assert_eq!(a.mem_used_total(), 0);
    let s = a.reserve_stats();
    assert_eq!((s.misses, s.fallbacks, s.refusals), (3, 0, 3));
    // The miss marked the class: a pass gives it spares (and only it).
    provision_all(&a);
    let c = a.class_of(1000).unwrap();
    let (cost, pages) = (a.classes[c].cost, a.classes[c].spec.pages as u64);
    let spares = a.mem_used_total() / cost;
    assert!(spares >= 1 && a.mem_used_total() % cost == 0);
    assert_eq!(a.spare_pages(), spares * pages);
    a.alloc_bulk(&[1000; 3], &[1, 2, 3], &mut hs).unwrap();
    for (i, &h) in hs.iter().enumerate() {
        assert_eq!(unpack(h).0, c);
        fill(&a, h, 1000, i as u64);
        check(&a, h, 1000, i as u64);
    }
    assert_eq!(a.reserve_stats().misses, 3, "served without a miss");
    a.free_bulk(&hs);
}

/// An object whose class is empty goes to a larger class that has room,
/// within the slack, and a recovery claims it there.
#[test]
fn reserve_falls_back_to_a_larger_class() {
    let a = reserve_slab();
    let mut big = Vec::new();
    // Give the 1,200-byte class a zspage (through a miss and a pass).
    assert!(a.alloc_bulk(&[1200], &[9], &mut big).is_err());
    provision_all(&a);
    a.alloc_bulk(&[1200], &[9], &mut big).unwrap();
    let big_class = unpack(big[0]).0;
    // 1,000 bytes: its own class is empty, the 1,200-byte one has room.
    let mut small = Vec::new();
    a.alloc_bulk(&[1000], &[10], &mut small).unwrap();
    let s = a.reserve_stats();
    // (The refusal is the first 1,200-byte allocation's.)
    assert_eq!((s.fallbacks, s.refusals), (1, 1));
    assert_eq!(unpack(small[0]).0, big_class, "placed in the larger class");
    fill(&a, small[0], 1000, 5);
    check(&a, small[0], 1000, 5);
    // Too small for the slack: 100 bytes may not take a 1,200-byte slot.
    let mut tiny = Vec::new();
    assert!(a.alloc_bulk(&[100], &[11], &mut tiny).is_err());
    // A recovery accepts an object in a class above its own.
    let b = SlabAllocator::new(SlabConfig::default());
    assert_eq!(b.claim(small[0], 1000, 10), recover::Claim::First);
    assert_eq!(b.claim(big[0], 1200, 9), recover::Claim::First);
    a.free_bulk(&small);
    a.free_bulk(&big);
}

/// The provisioner gives each class in use room in its vectors and owner
/// tables, so that taking spares allocates nothing on the heap.
#[test]
fn provisioned_class_has_room_and_boxes() {
    let a = reserve_slab();
    let mut hs = Vec::new();
    assert!(a.alloc_bulk(&[500], &[1], &mut hs).is_err());
    provision_all(&a);
    a.alloc_bulk(&[500], &[1], &mut hs).unwrap();
    provision_all(&a);
    let c = a.class_of(500).unwrap();
    let state = lock(&a.classes[c]);
    assert!(!state.spare.is_empty());
    assert!(
        state.boxes.len() >= 2,
        "owner tables kept: {}",
        state.boxes.len()
    );
    assert!(state.zs.capacity() - state.zs.len() >= 32);
    assert!(state.groups.iter().all(|g| g.capacity() - g.len() >= 32));
    drop(state);
    a.free_bulk(&hs);
}

/// Frees in a class whose vectors lack room (the provisioner behind) give
/// them room off the lock first: no hold grows one under the class lock,
/// where a fault could enter reclaim while queue threads wait on the lock.
#[test]
fn frees_grow_no_vector_under_the_class_lock() {
    let a = reserve_slab();
    let mut hs = Vec::new();
    while hs.len() < 3000 {
        let mut got = Vec::new();
        if a.alloc_bulk(&[500; 64], &[7; 64], &mut got).is_err() {
            provision_all(&a);
            continue;
        }
        hs.extend(got);
    }
    let c = a.class_of(500).unwrap();
    {
        let mut st = lock(&a.classes[c]);
        assert!(st.live_zspages > 64, "{} zspages", st.live_zspages);
        st.free_ids.shrink_to_fit();
        st.dead.shrink_to_fit();
        st.spare.shrink_to_fit();
        st.groups.iter_mut().for_each(|g| g.shrink_to_fit());
    }
    reserve::GROWN_UNDER_LOCK.with(|n| n.set(0));
    a.free_bulk(&hs);
    assert_eq!(reserve::GROWN_UNDER_LOCK.with(|n| n.get()), 0);
    assert_eq!(lock(&a.classes[c]).objs_used, 0);
}
