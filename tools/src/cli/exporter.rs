//! `zblk exporter`: serves `GET /metrics` (every device's statistics in
//! the Prometheus text format, see [`super::metrics`]) over HTTP, asking
//! the daemons at each scrape.

use super::args::ExporterArgs;
use super::scrape::scrape;
use super::{
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
    for req in server.incoming_requests() {
        serve(req, &a.run_dir, timeout);
    }
    Ok(())
}

/// Answers one request: the metrics, or 404 / 405.
fn serve(req: Request, run_dir: &Path, timeout: Duration) {
    let path = req.url().split('?').next().unwrap_or("").to_string();
    let resp = match (req.method(), path.as_str()) {
        (Method::Get | Method::Head, "/metrics") => match scrape(run_dir, timeout) {
            Ok(s) => text(200, metrics::render(&s), CONTENT_TYPE),
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

fn text(status: u16, body: String, content_type: &str) -> Response<std::io::Cursor<Vec<u8>>> {
    let r = Response::from_string(body).with_status_code(status);
    match Header::from_bytes("Content-Type", content_type) {
        Ok(h) => r.with_header(h),
        Err(()) => r,
    }
}
