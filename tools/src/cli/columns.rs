//! The columns of `zblk list`: zramctl's names, chosen with `--output`,
//! printed with human sizes or (`--bytes`) raw byte counts.

use super::size::format_size;
use serde_json::Value;

/// What a column shows of a `zblk list` entry (see `show::list_entry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cell {
    /// A byte count: human size, or raw with `--bytes`.
    Size(&'static str),
    /// A plain number.
    Count(&'static str),
    /// A string, with what to print when the entry lacks it.
    Text(&'static str, &'static str),
    /// `[SWAP]` when the device is active swap, else `-`.
    Swap,
}

/// One column: its header and what it shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// The header, as asked for (upper case).
    pub name: &'static str,
    cell: Cell,
}

const fn col(name: &'static str, cell: Cell) -> Column {
    Column { name, cell }
}

/// Every column, in the default order (zramctl's first).
const ALL: [Column; 15] = [
    col("NAME", Cell::Text("name", "?")),
    col("DISKSIZE", Cell::Size("disksize")),
    col("DATA", Cell::Size("data")),
    col("COMPR", Cell::Size("compr")),
    col("TOTAL", Cell::Size("total")),
    col("ALGORITHM", Cell::Text("algorithm", "?")),
    col("QUEUES", Cell::Count("queues")),
    col("ZERO-PAGES", Cell::Count("zero_pages")),
    col("MEM-LIMIT", Cell::Size("mem_limit")),
    col("MEM-USED", Cell::Size("mem_used")),
    col("SWAP", Cell::Swap),
    col("STATE", Cell::Text("state", "?")),
    col("RECOVERY", Cell::Text("recovery", "-")),
    col("RECOVERIES", Cell::Count("recoveries")),
    // Last: empty for most devices, and the default's earlier columns
    // keep their places.
    col("MOUNTPOINT", Cell::Text("mountpoint", "")),
];

/// zramctl's words for columns zblk names otherwise: a zramctl script's
/// `-o NAME,STREAMS,MOUNTPOINT` works unchanged, and its headers too.
const ALIASES: [(&str, &str); 1] = [("STREAMS", "QUEUES")];

/// The columns to print, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns(pub Vec<Column>);

impl Default for Columns {
    fn default() -> Self {
        Columns(ALL.to_vec())
    }
}

impl Columns {
    /// Parses `--output`: comma-separated column names, in any case.
    pub fn parse(s: &str) -> Result<Columns, String> {
        s.split(',')
            .map(find)
            .collect::<Result<_, _>>()
            .map(Columns)
    }

    /// The header line's cells.
    pub fn headers(&self) -> Vec<&'static str> {
        self.0.iter().map(|c| c.name).collect()
    }

    /// The cells of one entry; sizes raw when `bytes`.
    pub fn row(&self, entry: &Value, bytes: bool) -> Vec<String> {
        self.0.iter().map(|c| cell(c.cell, entry, bytes)).collect()
    }
}

/// The column named `name` (trimmed, any case), or why there is none.
fn find(name: &str) -> Result<Column, String> {
    let want = name.trim().to_ascii_uppercase();
    if let Some(c) = ALL.iter().find(|c| c.name == want) {
        return Ok(*c);
    }
    let alias = ALIASES.iter().find(|(a, _)| *a == want);
    if let Some(c) = alias.and_then(|(a, to)| Some((a, ALL.iter().find(|c| c.name == *to)?))) {
        return Ok(col(c.0, c.1.cell));
    }
    let valid: Vec<&str> = ALL
        .iter()
        .map(|c| c.name)
        .chain(ALIASES.iter().map(|(a, _)| *a))
        .collect();
    Err(format!(
        "unknown column '{}' (valid: {})",
        super::base::escape_controls(name.trim()),
        valid.join(", ")
    ))
}

fn cell(cell: Cell, e: &Value, bytes: bool) -> String {
    let n = |k: &str| e[k].as_u64().unwrap_or(0);
    match cell {
        Cell::Size(k) if bytes => n(k).to_string(),
        Cell::Size(k) => format_size(n(k)),
        Cell::Count(k) => n(k).to_string(),
        Cell::Text(k, missing) => e[k].as_str().unwrap_or(missing).to_string(),
        Cell::Swap if e["swap"] == Value::Bool(true) => "[SWAP]".into(),
        Cell::Swap => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry() -> Value {
        json!({"name": "/dev/ublkb0", "disksize": 1u64 << 30, "data": 8192,
               "queues": 2, "swap": true, "mountpoint": "[SWAP]", "state": "live"})
    }

    #[test]
    fn default_is_every_column_in_order() {
        let h = Columns::default().headers();
        assert_eq!(h.len(), 15);
        assert_eq!(&h[..4], ["NAME", "DISKSIZE", "DATA", "COMPR"]);
        assert_eq!(&h[13..], ["RECOVERIES", "MOUNTPOINT"]);
    }

    #[test]
    fn output_selects_and_orders_columns_in_any_case() {
        let c = Columns::parse("data, name,Queues").unwrap();
        assert_eq!(c.headers(), ["DATA", "NAME", "QUEUES"]);
        assert_eq!(c.row(&entry(), false), ["8K", "/dev/ublkb0", "2"]);
    }

    #[test]
    fn zramctl_aliases_keep_their_headers() {
        let c = Columns::parse("NAME,STREAMS,MOUNTPOINT").unwrap();
        assert_eq!(c.headers(), ["NAME", "STREAMS", "MOUNTPOINT"]);
        assert_eq!(c.row(&entry(), false), ["/dev/ublkb0", "2", "[SWAP]"]);
    }

    #[test]
    fn bytes_prints_raw_sizes_only() {
        let c = Columns::parse("DISKSIZE,DATA,COMPR,QUEUES").unwrap();
        assert_eq!(c.row(&entry(), false), ["1G", "8K", "0B", "2"]);
        assert_eq!(c.row(&entry(), true), ["1073741824", "8192", "0", "2"]);
    }

    #[test]
    fn unknown_column_lists_the_valid_ones() {
        let e = Columns::parse("NAME,MIGRATED").unwrap_err();
        assert!(e.starts_with("unknown column 'MIGRATED' (valid: NAME, DISKSIZE,"));
        assert!(e.ends_with("RECOVERIES, MOUNTPOINT, STREAMS)"), "{e}");
        assert!(!e.contains('\n'));
        let e = Columns::parse("NAME,,DATA").unwrap_err();
        assert!(e.starts_with("unknown column ''"), "{e}"); // Found by the setup_conf fuzz target: a name with a newline
                                                            // inside made a two-line error.
        let e = Columns::parse("NAME,DA\nTA\r").unwrap_err();
        assert!(e.starts_with("unknown column 'DA\\nTA' (valid:"), "{e}");
        assert!(!e.contains(['\n', '\r']), "{e:?}");
    }
}
