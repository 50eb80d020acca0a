//! Sizes on the command line: `4096`, `512K`, `8G`.

use zblk::PAGE_SIZE_U64;

/// Parses a byte count with an optional binary suffix K, M, G or T (also
/// `KB`/`KiB` forms, any case), as zramctl does.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad =
        || format!("invalid size '{s}': expected a number with an optional K, M, G or T suffix");
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    if num.is_empty() {
        return Err(bad());
    }
    let n: u64 = num.parse().map_err(|_| bad())?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("invalid size '{s}': too large"))
}

/// Parses a device size: a non-zero multiple of 4 KB.
pub fn parse_disk_size(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    if n == 0 {
        return Err("size must not be zero".into());
    }
    if n % PAGE_SIZE_U64 != 0 {
        return Err(format!(
            "size {s} ({n} bytes) is not a multiple of 4 KB (4096 bytes)"
        ));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("8M"), Ok(8 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("3gb"), Ok(3 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size(" 16M "), Ok(16 << 20));
    }

    #[test]
    fn bad_sizes_are_refused_with_the_input_named() {
        for bad in ["", "G", "-1G", "1.5G", "1X", "1 G", "0x10", "12Q"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains("invalid size"), "{bad}: {e}");
        }
        assert!(parse_size("16777216T").unwrap_err().contains("too large"));
        assert!(parse_size("99999999999999999999").is_err());
    }

    #[test]
    fn disk_sizes_are_nonzero_page_multiples() {
        assert_eq!(parse_disk_size("1G"), Ok(1 << 30));
        assert_eq!(parse_disk_size("4K"), Ok(4096));
        assert_eq!(parse_disk_size("0").unwrap_err(), "size must not be zero");
        assert!(parse_disk_size("1000")
            .unwrap_err()
            .contains("not a multiple of 4 KB"));
        assert!(parse_disk_size("6K")
            .unwrap_err()
            .contains("not a multiple of 4 KB"));
    }
}
