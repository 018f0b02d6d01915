//! The live endpoint: this process's trace over HTTP, for `comms-analyzer watch` and `serve`.
//!
//! `GET /colltrace` answers a JSON array of [`Dump`](crate::Dump)s (one per rank of the
//! process) with trigger `live`; `GET /health` answers `{"ok":true}`; `POST /dump` dumps into
//! the configured directory and answers the paths.

use std::net::SocketAddr;
use std::sync::OnceLock;

use crate::schema::Trigger;

static ADDR: OnceLock<Option<SocketAddr>> = OnceLock::new();

/// The bound address, once serving.
pub(crate) fn addr() -> Option<SocketAddr> {
    ADDR.get().copied().flatten()
}

/// Starts serving on `addr` (once per process; later calls keep the first server).
pub(crate) fn start(addr: SocketAddr) {
    ADDR.get_or_init(|| match serve(addr) {
        Ok(a) => {
            tracing::info!("colltrace: serving the live trace on http://{a}/colltrace");
            Some(a)
        }
        Err(e) => {
            tracing::warn!("colltrace: cannot serve the live trace on {addr}: {e}");
            None
        }
    });
}

fn json(body: Vec<u8>, code: u16) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let ct = tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..])
        .expect("static header");
    tiny_http::Response::from_data(body)
        .with_status_code(code)
        .with_header(ct)
}

/// `{"error": message}`, escaped as JSON needs.
fn error(message: &str, code: u16) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    json(
        serde_json::json!({ "error": message })
            .to_string()
            .into_bytes(),
        code,
    )
}

fn serve(addr: SocketAddr) -> Result<SocketAddr, String> {
    let server = tiny_http::Server::http(addr).map_err(|e| e.to_string())?;
    let bound = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| "not an IP listener".to_string())?;
    std::thread::Builder::new()
        .name("colltrace-http".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let path = req.url().split('?').next().unwrap_or("").to_string();
                let resp = match (req.method(), path.as_str()) {
                    (tiny_http::Method::Get, "/colltrace") => {
                        let dumps = crate::registry::snapshot(Trigger::Live, None);
                        match serde_json::to_vec(&dumps) {
                            Ok(b) => json(b, 200),
                            Err(e) => error(&e.to_string(), 500),
                        }
                    }
                    (tiny_http::Method::Get, "/health") => json(
                        serde_json::json!({ "ok": true }).to_string().into_bytes(),
                        200,
                    ),
                    (tiny_http::Method::Post, "/dump") => {
                        match crate::registry::dump_configured(
                            Trigger::Api,
                            Some("requested over HTTP"),
                        ) {
                            Ok(p) => json(serde_json::to_vec(&p).unwrap_or_default(), 200),
                            Err(e) => error(&e.to_string(), 500),
                        }
                    }
                    _ => error("not found: GET /colltrace, GET /health, POST /dump", 404),
                };
                if let Err(e) = req.respond(resp) {
                    tracing::debug!("colltrace: http response: {e}");
                }
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(bound)
}
