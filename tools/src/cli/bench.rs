//! `zblk bench`: the engine over a file of pages, no device needed.

use super::args::BenchArgs;
use super::base::{CliError, CliResult};
use zblk_bench::discard::{discard_bench, DiscardOptions};
use zblk_bench::engine::{self as bench, BenchOptions};

/// Runs the bench and prints its report (a table, or JSON).
pub fn bench(a: BenchArgs) -> CliResult {
    let data = bench::load_input(&a.input).map_err(|e| CliError(e.to_string()))?;
    let base = if a.private {
        BenchOptions::default()
    } else {
        BenchOptions::daemon()
    };
    let opts = BenchOptions {
        algo: a.engine.algo,
        group_pages: usize::from(a.engine.group_pages),
        threads: usize::from(a.threads),
        request_pages: usize::from(a.request_pages),
        mode: a.engine.mode,
        compress_workers: usize::from(a.engine.compress_workers),
        ..base
    };
    let report = bench::run(&opts, &data).map_err(|e| CliError(format!("bench failed: {e}")))?;
    let mut v = serde_json::to_value(&report).map_err(|e| CliError(e.to_string()))?;
    if let Some(n) = a.discard_threads {
        add_discard_figures(&mut v, &opts, usize::from(n), &data)?;
    }
    if a.json {
        println!("{v}");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = v
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, x)| {
            let shown = match x {
                serde_json::Value::Number(n) if n.is_f64() => {
                    format!("{:.2}", n.as_f64().unwrap_or(0.0))
                }
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            vec![k.clone(), shown]
        })
        .collect();
    println!("{}", super::show::table(&["FIELD", "VALUE"], &rows));
    if report.verify_errors != 0 {
        return Err(CliError(format!(
            "{} pages did not read back identical",
            report.verify_errors
        )));
    }
    Ok(())
}

/// Runs the discard phase (deferred vs immediate free) and adds its three
/// figures to the report.
fn add_discard_figures(
    v: &mut serde_json::Value,
    opts: &BenchOptions,
    threads: usize,
    data: &[u8],
) -> CliResult {
    let d = DiscardOptions {
        algo: opts.algo,
        group_pages: opts.group_pages,
        discard_threads: threads,
        request_pages: opts.request_pages,
        copies: 1,
        rounds: 1,
    };
    let r = discard_bench(&d, data).map_err(|e| CliError(format!("discard bench failed: {e}")))?;
    if let Some(obj) = v.as_object_mut() {
        obj.insert("discard_threads".into(), threads.into());
        obj.insert("discard_deferred_ms".into(), r.discard_deferred_ms.into());
        obj.insert("discard_immediate_ms".into(), r.discard_immediate_ms.into());
        obj.insert("mem_used_total_after".into(), r.mem_used_total_after.into());
    }
    Ok(())
}
