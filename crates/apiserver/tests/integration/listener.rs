//! The listener: connections that never complete a TLS handshake are closed after the configured timeout, and no
//! more than the configured number of connections are open at once (more wait, and are served once a slot frees).

use crate::support;

use std::{net::SocketAddr, time::Duration};

use kube::{Api, api::ListParams};
use mcm_api::Machine;
use support::{DEADLINE, TestServer, eventually, within};
use tokio::{io::AsyncReadExt as _, net::TcpStream};

fn address(t: &TestServer) -> SocketAddr {
    let url = t.server().url();
    url.trim_start_matches("https://").parse().expect("host:port")
}

/// Reads until the server closes the connection; true when it did (EOF or reset) before the deadline.
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buffer = [0u8; 64];
    matches!(
        tokio::time::timeout(DEADLINE, stream.read(&mut buffer)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_start_tls_are_closed_after_the_handshake_timeout() {
    let t = TestServer::start_with(|c| c.tls_handshake_timeout = Duration::from_secs(1)).await;
    let mut idle = Vec::new();
    for _ in 0..20 {
        idle.push(TcpStream::connect(address(&t)).await.expect("connect"));
    }
    for stream in &mut idle {
        assert!(
            closed_by_server(stream).await,
            "an idle connection was closed by the server"
        );
    }
    let stats = t.server().connections();
    eventually(
        "the idle connections are counted as handshake timeouts and closed",
        || async { (stats.handshake_timeouts() >= 20 && stats.open() == 0).then_some(()) },
    )
    .await;
    // The server still serves clients that do complete the handshake.
    let machines: Api<Machine> = t.api();
    within("a list", machines.list(&ListParams::default()))
        .await
        .expect("a client that completes the handshake is served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_connection_limit_new_connections_wait_and_are_served_when_a_slot_frees() {
    let t = TestServer::start_with(|c| {
        c.max_connections = 2;
        c.tls_handshake_timeout = Duration::from_secs(2);
    })
    .await;
    let stats = t.server().connections();
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(TcpStream::connect(address(&t)).await.expect("connect"));
    }
    eventually("both slots are taken by the idle connections", || async {
        (stats.open() == 2).then_some(())
    })
    .await;
    // A third and fourth client connect while the limit is reached: the kernel queues them, the server does not
    // accept them until the idle connections time out, then serves the client's request.
    let machines: Api<Machine> = t.api();
    let waiting = tokio::spawn(async move { machines.list(&ListParams::default()).await });
    let mut extra = TcpStream::connect(address(&t))
        .await
        .expect("the kernel queues a connection");
    within("the waiting client is served once a slot frees", waiting)
        .await
        .expect("the task")
        .expect("the waiting client's list succeeds");
    assert!(
        closed_by_server(&mut extra).await,
        "the queued idle connection is accepted and timed out in turn"
    );
    assert_eq!(stats.peak(), 2, "never more connections open than the limit");
    for stream in &mut idle {
        assert!(closed_by_server(stream).await);
    }
}
