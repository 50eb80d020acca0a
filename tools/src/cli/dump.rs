//! `zblk dump`: one line per stored page (zram's debugfs `block_state`),
//! asked of the daemon chunk by chunk (`Request::Dump`) and printed as
//! each chunk arrives, so neither side ever holds the whole device.

use super::args::DumpArgs;
use super::base::{CliError, CliResult};
use std::io::{BufWriter, ErrorKind, Write};
use std::time::Duration;
use zblk::{SlotKind, SlotState};
use zblk_ublk::control::{self, Request, DUMP_CHUNK};

/// How long one chunk may take (a few thousand slot locks).
const CHUNK_TIMEOUT: Duration = Duration::from_secs(10);

/// The text format's header line.
const HEADER: &str = "    INDEX  SIZE    ATIME FLAGS   KIND          ALGO";

/// Why printing stopped early.
enum Stop {
    /// The reader went away (`| head`): it wanted no more.
    Closed,
    /// A real failure, to report.
    Failed(CliError),
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            ErrorKind::BrokenPipe => Stop::Closed,
            _ => Stop::Failed(CliError(format!("writing the dump: {e}"))),
        }
    }
}

impl From<CliError> for Stop {
    fn from(e: CliError) -> Self {
        Stop::Failed(e)
    }
}

/// `zblk dump -n ID [--json]`.
pub fn dump(a: DumpArgs) -> CliResult {
    let mut out = BufWriter::new(std::io::stdout().lock());
    match print_all(a.id, a.json, &mut out) {
        Ok(()) | Err(Stop::Closed) => Ok(()),
        Err(Stop::Failed(e)) => Err(e),
    }
}

/// Asks for the slots chunk by chunk and prints each chunk's lines.
fn print_all(id: u32, json: bool, out: &mut impl Write) -> Result<(), Stop> {
    if !json {
        writeln!(out, "{HEADER}")?;
    }
    let mut start = Some(0);
    while let Some(from) = start {
        let req = Request::Dump {
            start: from,
            count: DUMP_CHUNK,
        };
        let r = control::request(id, &req, CHUNK_TIMEOUT).map_err(CliError::from)?;
        let slots: Vec<SlotState> =
            serde_json::from_value(r["slots"].clone()).map_err(|e| bad_reply(id, &e))?;
        for s in &slots {
            match json {
                true => serde_json::to_writer(&mut *out, s).map_err(std::io::Error::from)?,
                false => write!(out, "{}", text_line(s))?,
            }
            writeln!(out)?;
        }
        out.flush()?;
        start = r["next"].as_u64();
        if start.is_some_and(|n| n <= from) {
            return Err(bad_reply(id, &"its next chunk does not move on").into());
        }
    }
    Ok(())
}

/// A reply that is not a dump chunk.
fn bad_reply(id: u32, why: &dyn std::fmt::Display) -> CliError {
    CliError(format!("device {id}: bad dump reply: {why}"))
}

/// One page in the text format: index, size in bytes, access time in
/// seconds, flags, kind, algorithm.
fn text_line(s: &SlotState) -> String {
    format!(
        "{:>9} {:>5} {:>8} {}  {:<13} {}",
        s.index,
        s.size,
        s.atime,
        flags(s),
        s.kind.name(),
        s.algo.as_deref().unwrap_or("-")
    )
}

/// zram's `block_state` flags, one letter each or `.`: s same-filled,
/// w written back, h huge (stored raw), p packed, i idle, n
/// incompressible.
fn flags(s: &SlotState) -> String {
    let kind = |k: SlotKind, c: char| if s.kind == k { c } else { '.' };
    let flag = |on: bool, c: char| if on { c } else { '.' };
    [
        kind(SlotKind::Same, 's'),
        kind(SlotKind::WrittenBack, 'w'),
        kind(SlotKind::Huge, 'h'),
        kind(SlotKind::Packed, 'p'),
        flag(s.idle, 'i'),
        flag(s.incompressible, 'n'),
    ]
    .iter()
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(index: u64, kind: SlotKind, size: u32, algo: Option<&str>) -> SlotState {
        SlotState {
            index,
            kind,
            size,
            algo: algo.map(Into::into),
            idle: false,
            incompressible: false,
            atime: 12,
        }
    }

    #[test]
    fn text_lines_line_up_under_the_header() {
        let same = slot(0, SlotKind::Same, 0, None);
        let c = SlotState {
            idle: true,
            ..slot(123456, SlotKind::Compressed, 1234, Some("lz4"))
        };
        let huge = SlotState {
            incompressible: true,
            ..slot(7, SlotKind::Huge, 4096, None)
        };
        let back = slot(9, SlotKind::WrittenBack, 700, Some("zstd:9"));
        assert_eq!(
            text_line(&same),
            "        0     0       12 s.....  same          -"
        );
        assert_eq!(
            text_line(&c),
            "   123456  1234       12 ....i.  compressed    lz4"
        );
        assert_eq!(
            text_line(&huge),
            "        7  4096       12 ..h..n  huge          -"
        );
        assert_eq!(
            text_line(&back),
            "        9   700       12 .w....  written_back  zstd:9"
        );
        let col = |line: &str, word: &str| line.find(word).unwrap();
        assert_eq!(col(HEADER, "KIND"), col(&text_line(&c), "compressed"));
        assert_eq!(col(HEADER, "ALGO"), col(&text_line(&c), "lz4"));
        assert_eq!(col(HEADER, "FLAGS"), col(&text_line(&c), "....i."));
    }
}
