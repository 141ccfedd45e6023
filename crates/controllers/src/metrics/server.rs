//! The HTTP endpoints served on `--port`: `/metrics`, `/healthz` and `/readyz`.

use std::{net::SocketAddr, sync::Arc};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};

use super::Metrics;

async fn readyz_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    let (ready, text) = metrics.readiness();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, text)
}

async fn metrics_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        StatusCode::OK,
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.encode(),
    )
}

/// Binds `addr` (port 0 picks a free port) and serves `/metrics` and `/healthz` until `shutdown` resolves. Returns
/// the bound address and the server task.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    // `/healthz` answers OK while the process serves, as the reference's does (§8.4); `/readyz` answers 503 until the
    // machine cache has synced and while any added check fails (the provider unreachable).
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "OK" }))
        .route("/readyz", get(readyz_handler))
        .with_state(metrics);
    let task = tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
            tracing::warn!(error = %err, "metrics server stopped");
        }
    });
    Ok((bound, task))
}
