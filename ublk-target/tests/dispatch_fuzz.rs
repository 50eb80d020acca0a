//! Fuzzing the request path: random ublk I/O descriptors (any op, any
//! flags, any sector, any length) through `dispatch`, checked against a
//! plain model of the device's pages, and random bytes through the control
//! socket's request parser. Nothing may panic, every refusal must carry the
//! right errno, and every successful read must return the model's bytes.

use proptest::prelude::*;
use std::io::Write;
use std::os::unix::net::UnixStream;
use zblk::{Store, StoreConfig, PAGE_SIZE};
use zblk_ublk::control::read_request;
use zblk_ublk::io::{dispatch, IoDesc, Served};

const PAGES: u64 = 32;
const SECTORS: u64 = PAGES * 8;
const BUF: usize = 16 * PAGE_SIZE;

fn sector() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => (0..SECTORS / 8).prop_map(|p| p * 8),
        1 => 0..SECTORS + 16,
        1 => any::<u64>(),
        1 => Just(u64::MAX),
    ]
}

fn nr_sectors() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => (1u32..=16).prop_map(|p| p * 8),
        1 => 0u32..200,
        1 => any::<u32>(),
    ]
}

fn desc() -> impl Strategy<Value = IoDesc> {
    (
        0u32..8,
        prop::bits::u32::masked(0xffff_ff00),
        sector(),
        nr_sectors(),
    )
        .prop_map(|(op, flags, start_sector, nr_sectors)| IoDesc {
            op_flags: op | flags,
            nr_sectors,
            start_sector,
        })
}

/// What the model says a request must get.
fn expected(d: &IoDesc) -> Result<i32, i32> {
    let (op, start, n) = (
        d.op_flags & 0xff,
        d.start_sector as u128,
        d.nr_sectors as u128,
    );
    match op {
        2 => return Ok(0),
        0 | 1 | 3 | 5 => {}
        _ => return Err(-libc::EOPNOTSUPP),
    }
    let (off, len) = (start * 512, n * 512);
    if off > u64::MAX as u128 {
        return Err(-libc::EINVAL);
    }
    if (op == 0 || op == 1) && len > BUF as u128 {
        return Err(-libc::EINVAL);
    }
    if off % 4096 != 0 || len % 4096 != 0 || off + len > (SECTORS * 512) as u128 {
        return Err(-libc::EINVAL);
    }
    Ok(if op <= 1 { len as i32 } else { 0 })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_descriptors_match_the_model(descs in prop::collection::vec(desc(), 1..40), seed in any::<u8>()) {
        let store = Store::new(StoreConfig::new(PAGES * PAGE_SIZE as u64)).unwrap();
        let mut ctx = store.new_ctx();
        let mut model = vec![0u8; (PAGES as usize) * PAGE_SIZE];
        let mut buf = vec![0u8; BUF];
        for (i, d) in descs.iter().enumerate() {
            let want = expected(d);
            let fill = seed.wrapping_add(i as u8);
            if d.op_flags & 0xff == 1 {
                for (j, b) in buf.iter_mut().enumerate() {
                    *b = fill ^ (j / 97) as u8;
                }
            }
            // A store without a backing device never waits for a block.
            let got = dispatch(&mut ctx, d, &mut buf).map(|s| match s {
                Served::Done(r) => r,
                Served::Wait(w) => panic!("a read waits for {w:?} with no backing device"),
            }).map_err(|(errno, _)| errno);
            prop_assert_eq!(got, want, "{:?}", d);
            // FLUSH carries any sector: nothing to check beyond its result.
            if want.is_err() || d.op_flags & 0xff == 2 {
                continue;
            }
            let off = (d.start_sector * 512) as usize;
            let len = d.nr_sectors as usize * 512;
            match d.op_flags & 0xff {
                0 => prop_assert!(buf[..len] == model[off..off + len], "read {:?}", d),
                1 => model[off..off + len].copy_from_slice(&buf[..len]),
                3 | 5 => model[off..off + len].fill(0),
                _ => {}
            }
        }
    }

    #[test]
    fn control_requests_from_random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&bytes).unwrap();
        drop(a);
        // Garbage must be an error (or, by chance, a valid request), never a panic.
        let _ = read_request(&mut b);
    }
}
