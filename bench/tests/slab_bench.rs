//! The discard and churn measurements run end to end on the shipped
//! fixture of real pages. Only their bookkeeping is checked here (memory
//! comes back, data survives); their timings go to BENCHMARKS.md.

use zblk_bench::discard::{churn_bench, discard_bench, ChurnOptions, DiscardOptions};
use zblk_bench::engine::load_input;
use zblk_bench::fixture_path;

fn real_pages() -> Vec<u8> {
    load_input(&fixture_path()).expect("the fixture loads")
}

#[test]
fn discard_bench_frees_everything_in_both_modes() {
    let data = real_pages();
    for threads in [1, 3] {
        let opts = DiscardOptions {
            discard_threads: threads,
            copies: 4,
            rounds: 2,
            request_pages: 5,
            ..DiscardOptions::default()
        };
        let r = discard_bench(&opts, &data).unwrap();
        assert_eq!(r.pages, 4 * 96);
        assert!(r.mem_used_total_full > 0);
        assert_eq!(r.mem_used_total_after, r.mem_used_total_empty);
        assert_eq!(r.mem_used_total_after_immediate, r.mem_used_total_empty);
        assert!(r.discard_deferred_ms > 0.0 && r.discard_immediate_ms > 0.0);
    }
}

#[test]
fn churn_bench_keeps_data_and_compaction_helps() {
    let data = real_pages();
    let opts = ChurnOptions {
        copies: 20,
        ..ChurnOptions::default()
    };
    let r = churn_bench(&opts, &data).unwrap();
    assert_eq!(r.verify_errors, 0);
    assert!(r.overwritten > 0 && r.discarded > 0);
    assert!(r.ratio_mem_full > 1.0 && r.ratio_data_full >= r.ratio_mem_full);
    assert!(r.frag_after_compact <= r.frag_before_compact);
    assert!(r.frag_after_compact >= 1.0);
}

#[test]
fn bench_inputs_are_checked() {
    let opts = DiscardOptions::default();
    assert!(discard_bench(&opts, &[]).is_err());
    assert!(discard_bench(&opts, &[0u8; 100]).is_err());
    let zero_threads = DiscardOptions {
        discard_threads: 0,
        ..DiscardOptions::default()
    };
    assert!(discard_bench(&zero_threads, &[0u8; 4096]).is_err());
}
