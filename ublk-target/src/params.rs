//! The block device zblk presents: 4 KB logical blocks (no sub-page I/O
//! ever reaches the engine), no write cache, discard and write-zeroes.

use libublk::sys;

/// Largest discard / write-zeroes request, in 512-byte sectors: the most a
/// 32-bit sector count can express, rounded down to whole 4 KB pages.
pub const MAX_DISCARD_SECTORS: u32 = (u32::MAX >> 9) & !7;

/// The I/O buffer size libublk accepts at most (one request's data).
pub const MAX_IO_BUF_BYTES: u32 = 32 << 20;

/// I/O buffer that holds a 2 MB swap write (a PMD-sized folio) whole.
pub const FULL_IO_BUF_BYTES: u32 = 2 << 20;

/// Smallest I/O buffer chosen automatically.
pub const MIN_AUTO_IO_BUF_BYTES: u32 = 128 << 10;

/// The ublk parameters of a `size`-byte device whose requests carry at
/// most `io_buf_bytes` of data.
pub fn device_params(size: u64, io_buf_bytes: u32) -> sys::ublk_params {
    sys::ublk_params {
        types: sys::UBLK_PARAM_TYPE_BASIC | sys::UBLK_PARAM_TYPE_DISCARD,
        basic: sys::ublk_param_basic {
            // Data is in RAM when a write completes: no volatile cache, so
            // the kernel sends no flushes. Not rotational: swap then uses
            // its SSD-style cluster allocation and discards.
            attrs: 0,
            logical_bs_shift: 12,
            physical_bs_shift: 12,
            io_opt_shift: 12,
            io_min_shift: 12,
            max_sectors: io_buf_bytes >> 9,
            dev_sectors: size >> 9,
            ..Default::default()
        },
        discard: sys::ublk_param_discard {
            discard_alignment: 0,
            discard_granularity: 4096,
            max_discard_sectors: MAX_DISCARD_SECTORS,
            max_write_zeroes_sectors: MAX_DISCARD_SECTORS,
            // The driver supports single-segment discard only.
            max_discard_segments: 1,
            reserved0: 0,
        },
        ..Default::default()
    }
}

/// Picks the per-tag I/O buffer size when the user gave none.
///
/// Every tag of every queue owns a buffer and all of them are locked and
/// faulted in when the queue starts (a swap device must never fault on its
/// own buffers: see `queue::locked_io_bufs`), so the cost is
/// `queues * depth * size` of RAM for the device's life. Take 2 MB (no
/// split of a PMD-sized swap write) when that stays within 1/32 of RAM,
/// else halve down to 128 KB; larger requests are split by the block layer.
pub fn auto_io_buf_bytes(queues: u32, depth: u32, mem_total: u64) -> u32 {
    let budget = mem_total / 32;
    let tags = u64::from(queues.max(1)) * u64::from(depth.max(1));
    let mut size = FULL_IO_BUF_BYTES;
    while size > MIN_AUTO_IO_BUF_BYTES && tags * u64::from(size) > budget {
        size /= 2;
    }
    size
}

/// Physical memory in bytes (`MemTotal` of `/proc/meminfo`), if readable.
pub fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_total(&text)
}

fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_describe_a_4k_discarding_device() {
        let p = device_params(1 << 30, 2 << 20);
        assert_eq!(
            p.types,
            sys::UBLK_PARAM_TYPE_BASIC | sys::UBLK_PARAM_TYPE_DISCARD
        );
        assert_eq!(p.basic.dev_sectors, (1 << 30) >> 9);
        assert_eq!(p.basic.logical_bs_shift, 12);
        assert_eq!(p.basic.max_sectors, 4096);
        assert_eq!(p.basic.attrs & sys::UBLK_ATTR_VOLATILE_CACHE, 0);
        assert_eq!(p.basic.attrs & sys::UBLK_ATTR_ROTATIONAL, 0);
        assert_eq!(p.discard.discard_granularity, 4096);
        assert_eq!(p.discard.max_discard_segments, 1);
        assert_eq!(MAX_DISCARD_SECTORS % 8, 0);
        assert!(
            p.discard.max_discard_sectors >= 1 << 22,
            "at least 2 GB per discard"
        );
    }

    #[test]
    fn auto_io_buf_fits_the_budget() {
        // 64 GB, 8 queues x 128: 2 MB each is 2 GB = 1/32 of RAM.
        assert_eq!(auto_io_buf_bytes(8, 128, 64 << 30), 2 << 20);
        // 2 GB, 2 queues x 128: budget 64 MB -> 256 KB each.
        assert_eq!(auto_io_buf_bytes(2, 128, 2 << 30), 256 << 10);
        // Tiny machine: never below the floor.
        assert_eq!(auto_io_buf_bytes(64, 4096, 1 << 30), MIN_AUTO_IO_BUF_BYTES);
        assert_eq!(auto_io_buf_bytes(0, 0, 0), MIN_AUTO_IO_BUF_BYTES);
    }

    #[test]
    fn meminfo_parses() {
        let t = "MemTotal:        2014512 kB\nMemFree:  1 kB\n";
        assert_eq!(parse_mem_total(t), Some(2014512 * 1024));
        assert_eq!(parse_mem_total("nothing"), None);
    }
}
