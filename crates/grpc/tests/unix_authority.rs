//! A gRPC client that sends the socket path as `:authority` on a unix socket (grpc-core, as Python's grpcio does since
//! grpc 1.57: the percent-encoded path; grpc-java: the raw path) is answered, not reset with PROTOCOL_ERROR. The
//! call is written by hand (HTTP/2 frames, HPACK) as those clients write it, so this test needs no Python;
//! crates/cli/tests/e2e/provider_python.rs runs the real grpcio client.

use std::{sync::Arc, time::Duration};

use mcm_grpc::{Endpoint, ProviderInfo};
use mcm_provider_sim::{SimConfig, SimDriver};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::UnixStream,
};

const DEADLINE: Duration = Duration::from_secs(30);
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(payload.len()).unwrap().to_be_bytes()[1..].to_vec();
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// What came back for the call: the trailers' `grpc-status`, the response message bytes, and whether the stream
/// was reset.
#[derive(Debug, Default)]
struct Answer {
    grpc_status: Option<String>,
    data: Vec<u8>,
    reset: Option<u32>,
}

/// Sends Identity/Probe on stream 1 with this `:authority` and reads until the stream ends.
async fn probe(socket: &std::path::Path, authority: &str) -> Answer {
    let mut stream = UnixStream::connect(socket).await.expect("connect");
    let mut encoder = loona_hpack::Encoder::new();
    let fields: [(&[u8], &[u8]); 6] = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/mcm.provider.v1.Identity/Probe"),
        (b":authority", authority.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ];
    let mut request = PREFACE.to_vec();
    request.extend(frame(0x4, 0, 0, &[]));
    request.extend(frame(0x1, 0x4, 1, &encoder.encode(fields)));
    // An empty ProbeRequest: uncompressed, length 0.
    request.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0]));
    stream.write_all(&request).await.expect("send the call");

    let mut decoder = loona_hpack::Decoder::new();
    let mut answer = Answer::default();
    let mut buffer = Vec::new();
    loop {
        while buffer.len() >= 9 {
            let length = usize::from(buffer[0]) << 16 | usize::from(buffer[1]) << 8 | usize::from(buffer[2]);
            if buffer.len() < 9 + length {
                break;
            }
            let frame_bytes: Vec<u8> = buffer.drain(..9 + length).collect();
            let (kind, flags) = (frame_bytes[3], frame_bytes[4]);
            let id = u32::from_be_bytes(frame_bytes[5..9].try_into().unwrap()) & 0x7fff_ffff;
            let payload = &frame_bytes[9..];
            match kind {
                0x4 if flags & 0x1 == 0 => stream.write_all(&frame(0x4, 0x1, 0, &[])).await.expect("ack"),
                0x1 => {
                    for (name, value) in decoder.decode(payload).expect("HPACK from h2") {
                        if name == b"grpc-status" {
                            answer.grpc_status = Some(String::from_utf8(value).unwrap());
                        }
                    }
                    if id == 1 && flags & 0x1 != 0 {
                        return answer;
                    }
                }
                0x0 if id == 1 => answer.data.extend_from_slice(payload),
                0x3 if id == 1 => {
                    answer.reset = Some(u32::from_be_bytes(payload[..4].try_into().unwrap()));
                    return answer;
                }
                _ => {}
            }
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.expect("read");
        assert!(n > 0, "the connection closed before the call ended: {answer:?}");
        buffer.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test]
async fn a_call_with_the_socket_path_as_authority_is_answered() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("p.sock");
    let endpoint = Endpoint::Unix(path.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let info = ProviderInfo {
        name: "sim".into(),
        version: "test".into(),
        optional_methods: Vec::new(),
    };
    let driver = Arc::new(SimDriver::new(SimConfig::default()));
    let server = tokio::spawn(async move {
        mcm_grpc::serve(driver, info, &endpoint, None, async move {
            let _ = stopped.await;
        })
        .await
    });
    tokio::time::timeout(DEADLINE, async {
        while UnixStream::connect(&path).await.is_err() {
            assert!(!server.is_finished(), "the provider stopped before serving");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the provider serves in time");

    let percent_encoded = path
        .display()
        .to_string()
        .trim_start_matches('/')
        .replace('/', "%2F");
    let raw = path.display().to_string();
    for authority in [percent_encoded.as_str(), raw.as_str(), "localhost"] {
        let answer = tokio::time::timeout(DEADLINE, probe(&path, authority))
            .await
            .expect("the call ends in time");
        assert_eq!(answer.reset, None, "{authority}: the stream was reset");
        assert_eq!(
            answer.grpc_status.as_deref(),
            Some("0"),
            "{authority}: {answer:?}"
        );
        // ProbeResponse { ready: true }: uncompressed, length 2, field 1 = 1.
        assert_eq!(answer.data, [0, 0, 0, 0, 2, 0x08, 0x01], "{authority}");
    }
    let _ = stop.send(());
}
