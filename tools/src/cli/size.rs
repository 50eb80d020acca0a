//! Sizes in tables: `0B`, `4K`, `1.5M` (the command line's are parsed by
//! `zblk_ublk::size`).

/// Formats bytes the way zramctl does: `0B`, `4K`, `1.5M`, `8G`.
pub fn format_size(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut unit = 0;
    let mut v = n as f64;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 || (v.fract() * 10.0).round() == 0.0 || v >= 100.0 {
        format!("{}{}", v.round() as u64, UNITS[unit])
    } else {
        format!("{v:.1}{}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_format_like_zramctl() {
        assert_eq!(format_size(0), "0B");
        assert_eq!(format_size(512), "512B");
        assert_eq!(format_size(4096), "4K");
        assert_eq!(format_size(1536 << 10), "1.5M");
        assert_eq!(format_size(8 << 30), "8G");
        assert_eq!(format_size((1 << 30) + 1), "1G");
        assert_eq!(format_size(150 << 20), "150M");
    }
}
