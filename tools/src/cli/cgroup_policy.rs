//! `zblk setup --id N --policy`: one round of the idle policy of a
//! section limited to, or excluding, cgroups (`policy-cgroups`,
//! `policy-exclude-cgroups`), run as root by the timer zblk's systemd
//! generator writes for that section.
//!
//! Which cgroup maps a swapped page only the page tables say, which the
//! daemon, without `CAP_SYS_ADMIN`, cannot read: so the daemon's own
//! policy is off for such a section, and this process asks for what it
//! would do. A round scans every process's page tables once (the pass
//! of `zblk stat --by`) for the device's pages the filter takes, then:
//! - writeback (`writeback-idle-after`): has the daemon mark idle exactly
//!   the pages that old (clearing younger pages' marks), asks the slots
//!   of the filter's pages which are idle now, and writes those back;
//! - recompression (`recompress-idle-after`): has the daemon mark idle
//!   exactly the pages that old, and recompresses the idle pages within
//!   the filter's page ranges (the engine checks the mark under the slot
//!   lock).
//!
//! A page accessed between the slots' answer and its writeback is
//! written back all the same (read back from the backing device on its
//! next access, as any written-back page). Pages no process maps (shmem,
//! tmpfs) are no cgroup's: neither filter takes them.

use super::attrib::{self, CgroupFilter};
use super::base::{CliError, CliResult};
use super::conf::CgroupPolicy;
use super::sys::check_root;
use super::tier;
use std::time::Duration;
use zblk_ublk::control::{self, Request};

/// The command, as a refusal names it.
const CMD: &str = "zblk setup --policy";

/// One round of policy `p` on device `id`; prints a line per half.
pub fn round(id: u32, p: &CgroupPolicy) -> CliResult {
    check_root(CMD)?;
    let offsets = attrib::cgroup_offsets(id, &p.filter, CMD)?;
    let whose = describe(&p.filter);
    if p.writeback_after > 0 {
        mark_exactly(id, p.writeback_after)?;
        let idle = attrib::idle_offsets(id, &offsets)?;
        let sum = tier::writeback_pages(id, &attrib::ranges(&idle), 0)?;
        println!(
            "ublkb{id}: writeback of {whose}: {} of their {} pages idle for {} s: {}",
            idle.len(),
            offsets.len(),
            p.writeback_after,
            sum.line()
        );
    }
    if p.recompress_after > 0 {
        mark_exactly(id, p.recompress_after)?;
        let sum = tier::recompress_idle_pages(id, &attrib::ranges(&offsets))?;
        println!(
            "ublkb{id}: recompression of {whose}: their {} pages, those idle for {} s: {}",
            offsets.len(),
            p.recompress_after,
            sum.line()
        );
    }
    Ok(())
}

/// Has device `id` mark idle exactly its pages not accessed for `age`
/// seconds.
fn mark_exactly(id: u32, age: u64) -> Result<(), CliError> {
    let req = Request::Idle {
        age: Some(age),
        exact: true,
    };
    control::request(id, &req, Duration::from_secs(120))?;
    Ok(())
}

/// Whose pages `filter` takes, in words.
fn describe(filter: &CgroupFilter) -> String {
    match filter {
        CgroupFilter::Only(l) => format!("the cgroups {}", l.join(" ")),
        CgroupFilter::Except(l) => format!("every cgroup but {}", l.join(" ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_says_whose_pages() {
        let l = vec!["/a".to_string(), "/b/c".to_string()];
        assert_eq!(
            describe(&CgroupFilter::Only(l.clone())),
            "the cgroups /a /b/c"
        );
        assert_eq!(
            describe(&CgroupFilter::Except(l)),
            "every cgroup but /a /b/c"
        );
    }
}
