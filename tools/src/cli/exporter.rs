//! `zblk exporter`: serves `GET /metrics` (every device's statistics in
//! the Prometheus text format, see [`super::metrics`]) over HTTP, asking
//! the daemons at each scrape; with `--by`, the series of `zblk stat --by
//! WHO --format prometheus` too (see [`super::attrib`]), from a pass made
//! at each scrape.

use super::args::{By, ExporterArgs};
use super::scrape::scrape;
use super::sys::check_root;
use super::{
    attrib,
    base::{CliError, CliResult},
    metrics,
};
use std::path::Path;
use std::time::Duration;
use tiny_http::{Header, Method, Request, Response, Server};

/// The content type of the text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `zblk exporter`.
pub fn exporter(a: ExporterArgs) -> CliResult {
    if a.by.is_some() {
        // Refused now, not at each scrape.
        check_root("zblk exporter --by")?;
    }
    let server = Server::http(a.listen)
        .map_err(|e| CliError(format!("cannot listen on {}: {e}", a.listen)))?;
    let addr = server
        .server_addr()
        .to_ip()
        .map_or_else(|| a.listen.to_string(), |s| s.to_string());
    // The first line says where it listens (a test or a script that asked
    // for port 0 reads the port from it).
    println!("zblk exporter: listening on http://{addr}/metrics");
    let timeout = Duration::from_secs(a.timeout);
    let by = a.by.map(|by| (by, a.top));
    for req in server.incoming_requests() {
        serve(req, &a.run_dir, timeout, by);
    }
    Ok(())
}

/// Answers one request: the metrics (and, `by` given, the series of a
/// pass by that with so many rows a device), or 404 / 405.
fn serve(req: Request, run_dir: &Path, timeout: Duration, by: Option<(By, usize)>) {
    let path = req.url().split('?').next().unwrap_or("").to_string();
    let resp = match (req.method(), path.as_str()) {
        (Method::Get | Method::Head, "/metrics") => match body(run_dir, timeout, by) {
            Ok(b) => text(200, b, CONTENT_TYPE),
            Err(e) => text(500, format!("{e}\n"), "text/plain; charset=utf-8"),
        },
        (_, "/metrics") => text(405, "only GET /metrics\n".into(), "text/plain"),
        _ => text(
            404,
            "not found: zblk serves /metrics\n".into(),
            "text/plain",
        ),
    };
    // The scraper may have gone; nothing to do about it but log.
    if let Err(e) = req.respond(resp) {
        log::warn!("exporter: cannot answer: {e}");
    }
}

/// The metrics of every device, then the series of a pass by `by`.
fn body(run_dir: &Path, timeout: Duration, by: Option<(By, usize)>) -> Result<String, CliError> {
    let mut out = metrics::render(&scrape(run_dir, timeout)?);
    if let Some((by, top)) = by {
        out.push_str(&attrib::prometheus(by, top)?);
    }
    Ok(out)
}

fn text(status: u16, body: String, content_type: &str) -> Response<std::io::Cursor<Vec<u8>>> {
    let r = Response::from_string(body).with_status_code(status);
    match Header::from_bytes("Content-Type", content_type) {
        Ok(h) => r.with_header(h),
        Err(()) => r,
    }
}
