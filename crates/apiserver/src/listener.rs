//! The TLS listener: accepts connections up to a limit, gives each a deadline to complete its TLS handshake, and
//! serves HTTP/1.1 and HTTP/2 on the connections that do.
//!
//! Over the limit, new connections wait: the listener stops accepting until a connection ends, so they queue in the
//! kernel's accept backlog and are served as soon as a slot frees (as Go's `netutil.LimitListener` does), instead of
//! being reset and retried with backoff. Slots held by idle clients free within the handshake timeout, so a client
//! waiting behind them waits at most about that long; the accept backlog bounds the queue.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::body::Body;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{Semaphore, watch},
    task::JoinSet,
};

use crate::{auth, rest};

/// How the listener treats connections.
#[derive(Clone, Copy, Debug)]
pub struct ListenerLimits {
    /// A connection whose TLS handshake has not completed this long after it was accepted is closed.
    pub tls_handshake_timeout: Duration,
    /// At most this many connections are open at once; more wait to be accepted.
    pub max_connections: usize,
}

/// Connection counts, for operators and tests.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    open: AtomicUsize,
    peak: AtomicUsize,
    handshake_timeouts: AtomicUsize,
}

impl ConnectionStats {
    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// The most connections that were open at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// Connections closed because their TLS handshake did not complete in time.
    pub fn handshake_timeouts(&self) -> usize {
        self.handshake_timeouts.load(Ordering::SeqCst)
    }

    fn opened(&self) {
        let now = self.open.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
    }
}

/// Counts a connection open from its acceptance to its end.
struct OpenConnection(Arc<ConnectionStats>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The first pause after a failed accept (too many open files, ...), doubled on each failure in a row up to
/// [`MAX_ACCEPT_BACKOFF`], so that a failing accept does not spin a core (as Go's `http.Server` backs off).
const FIRST_ACCEPT_BACKOFF: Duration = Duration::from_millis(5);
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Accepts and serves connections until `shutdown` flips.
pub async fn accept_loop(
    listener: TcpListener,
    tls: tokio_rustls::TlsAcceptor,
    state: rest::AppState,
    limits: ListenerLimits,
    counts: Arc<ConnectionStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(
        limits.max_connections.clamp(1, Semaphore::MAX_PERMITS),
    ));
    let mut connections = JoinSet::new();
    let mut backoff = FIRST_ACCEPT_BACKOFF;
    loop {
        // A free slot first: at the limit, nothing more is accepted until a connection ends.
        let permit = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            _ = shutdown.changed() => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => {
                    backoff = FIRST_ACCEPT_BACKOFF;
                    accepted
                }
                Err(err) => {
                    tracing::warn!(error = %err, pause_ms = backoff.as_millis(), "accept failed");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        _ = shutdown.changed() => break,
                    }
                    backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
                    continue;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            _ = shutdown.changed() => break,
        };
        counts.opened();
        let open = OpenConnection(Arc::clone(&counts));
        let tls = tls.clone();
        let state = state.clone();
        let timeout = limits.tls_handshake_timeout;
        connections.spawn(async move {
            let _slot = permit;
            serve_connection(stream, peer, tls, state, timeout, &open.0).await;
        });
    }
    // Give responses in flight a moment, then cut what remains (idle keep-alive connections, open watches).
    let _ = tokio::time::timeout(Duration::from_millis(200), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

/// One connection: the TLS handshake within `handshake_timeout`, then HTTP until the client leaves.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    tls: tokio_rustls::TlsAcceptor,
    state: rest::AppState,
    handshake_timeout: Duration,
    counts: &ConnectionStats,
) {
    let stream = match tokio::time::timeout(handshake_timeout, tls.accept(stream)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => {
            tracing::debug!(%peer, error = %err, "TLS handshake failed");
            return;
        }
        Err(_) => {
            counts.handshake_timeouts.fetch_add(1, Ordering::SeqCst);
            tracing::debug!(%peer, timeout_ms = handshake_timeout.as_millis(), "TLS handshake timed out");
            return;
        }
    };
    // A client certificate the CA signed (the handshake verified it) authenticates every request of the
    // connection that carries no bearer token.
    let certificate_user = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(<[_]>::first)
        .and_then(|leaf| auth::user_from_certificate(leaf))
        .map(auth::ClientCertificateUser);
    let service = hyper::service::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
        let state = state.clone();
        if let Some(user) = &certificate_user {
            request.extensions_mut().insert(user.clone());
        }
        async move { Ok::<_, Infallible>(rest::handle(state, request.map(Body::new)).await) }
    });
    if let Err(err) = auto::Builder::new(TokioExecutor::new())
        .serve_connection_with_upgrades(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(%peer, error = %err, "connection ended with an error");
    }
}
