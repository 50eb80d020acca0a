//! `zblk bench`: the engine over a file of pages, no device needed.

use super::args::BenchArgs;
use super::{CliError, CliResult};
use zblk::bench::{self, BenchOptions};

/// Runs the bench and prints its report (a table, or JSON).
pub fn bench(a: BenchArgs) -> CliResult {
    let data = bench::load_input(&a.input).map_err(CliError)?;
    let opts = BenchOptions {
        algo: a.algo,
        group_pages: usize::from(a.group_pages),
        threads: usize::from(a.threads),
        request_pages: usize::from(a.request_pages),
        mode: a.mode,
    };
    let report = bench::run(&opts, &data).map_err(|e| CliError(format!("bench failed: {e}")))?;
    let v = serde_json::to_value(&report).map_err(|e| CliError(e.to_string()))?;
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
