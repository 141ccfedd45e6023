//! [`AuthorityFix`]: lets gRPC clients that send a socket path as `:authority` call a provider on a unix socket.
//!
//! grpc-core (Python's grpcio, C++, Ruby, PHP) sends the percent-encoded socket path (`tmp%2Fp.sock`) as the
//! `:authority` of a call on `unix:` since grpc 1.57, grpc-java and grpc-swift send the raw path; the h2 crate under
//! tonic refuses both as malformed (RFC 9113 8.3.1 allows only `host[:port]`) and resets the stream with
//! PROTOCOL_ERROR, and it has no option to relax that. The authority means nothing on a unix socket, so this reader
//! sits between the socket and h2: it decodes each request header block (HPACK), replaces an authority that is not
//! valid by `localhost` (the convention of kubelet's and tonic's own clients on unix sockets), and encodes the block
//! again. Every other frame and byte passes unchanged; writes pass through untouched.

use std::{
    io,
    pin::Pin,
    str::FromStr,
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection preface of HTTP/2 (RFC 9113 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The size of a frame header.
const FRAME_HEADER: usize = 9;
/// HEADERS and CONTINUATION frame types.
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
/// Frame flags.
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame we emit: the HTTP/2 default SETTINGS_MAX_FRAME_SIZE, which tonic's server keeps.
const MAX_FRAME: usize = 16_384;
/// The largest header block we buffer across CONTINUATION frames (h2's default header list limit is 16 KiB).
const MAX_BLOCK: usize = 1 << 20;
/// What replaces an authority h2 would refuse.
pub(crate) const UNIX_AUTHORITY: &str = "localhost";

/// A header block being collected (HEADERS, then CONTINUATION frames until END_HEADERS).
struct Block {
    stream_id: [u8; 4],
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The rewriting state of one connection's incoming bytes.
struct Rewriter {
    /// Bytes read from the socket and not yet rewritten (an incomplete frame).
    input: Vec<u8>,
    /// Rewritten bytes for the reader.
    output: Vec<u8>,
    /// The preface was seen (or the connection is not HTTP/2 with prior knowledge: everything passes).
    preface_done: bool,
    passthrough: bool,
    block: Option<Block>,
    /// The client's HPACK state (its dynamic table), and ours towards h2: both sides stay consistent because every
    /// block is decoded with the first and encoded with the second.
    decoder: loona_hpack::Decoder<'static>,
    encoder: loona_hpack::Encoder<'static>,
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Whether h2 accepts this `:authority` value.
fn valid_authority(value: &[u8]) -> bool {
    std::str::from_utf8(value).is_ok_and(|text| http::uri::Authority::from_str(text).is_ok())
}

impl Rewriter {
    fn new() -> Self {
        Self {
            input: Vec::new(),
            output: Vec::new(),
            preface_done: false,
            passthrough: false,
            block: None,
            decoder: loona_hpack::Decoder::new(),
            encoder: loona_hpack::Encoder::new(),
        }
    }

    /// Moves every complete frame of `input` to `output`, rewriting header blocks.
    fn process(&mut self) -> io::Result<()> {
        if self.passthrough {
            self.output.append(&mut self.input);
            return Ok(());
        }
        if !self.preface_done {
            let seen = self.input.len().min(PREFACE.len());
            if self.input[..seen] != PREFACE[..seen] {
                self.passthrough = true;
                self.output.append(&mut self.input);
                return Ok(());
            }
            if seen < PREFACE.len() {
                return Ok(());
            }
            self.output.extend(self.input.drain(..PREFACE.len()));
            self.preface_done = true;
        }
        while self.input.len() >= FRAME_HEADER {
            let length = usize::from(self.input[0]) << 16
                | usize::from(self.input[1]) << 8
                | usize::from(self.input[2]);
            if self.input.len() < FRAME_HEADER + length {
                break;
            }
            let frame: Vec<u8> = self.input.drain(..FRAME_HEADER + length).collect();
            self.frame(&frame)?;
        }
        Ok(())
    }

    fn frame(&mut self, frame: &[u8]) -> io::Result<()> {
        let (kind, flags) = (frame[3], frame[4]);
        let stream_id = [frame[5], frame[6], frame[7], frame[8]];
        let mut payload = &frame[FRAME_HEADER..];
        match kind {
            HEADERS => {
                if flags & PADDED != 0 {
                    let pad = usize::from(
                        *payload
                            .first()
                            .ok_or_else(|| invalid("HEADERS frame: padding".into()))?,
                    );
                    if pad + 1 > payload.len() {
                        return Err(invalid("HEADERS frame: padding longer than the frame".into()));
                    }
                    payload = &payload[1..payload.len() - pad];
                }
                let priority = if flags & PRIORITY != 0 {
                    let fields: [u8; 5] = payload
                        .get(..5)
                        .and_then(|p| p.try_into().ok())
                        .ok_or_else(|| invalid("HEADERS frame: priority".into()))?;
                    payload = &payload[5..];
                    Some(fields)
                } else {
                    None
                };
                self.block = Some(Block {
                    stream_id,
                    end_stream: flags & END_STREAM != 0,
                    priority,
                    fragment: payload.to_vec(),
                });
                if flags & END_HEADERS != 0 {
                    self.finish_block()?;
                }
            }
            CONTINUATION if self.block.as_ref().is_some_and(|b| b.stream_id == stream_id) => {
                let block = self.block.as_mut().expect("checked above");
                block.fragment.extend_from_slice(payload);
                if block.fragment.len() > MAX_BLOCK {
                    return Err(invalid(format!("a header block over {MAX_BLOCK} bytes")));
                }
                if flags & END_HEADERS != 0 {
                    self.finish_block()?;
                }
            }
            // Anything else (h2 itself refuses a frame between HEADERS and its CONTINUATION).
            _ => self.output.extend_from_slice(frame),
        }
        Ok(())
    }

    /// Decodes the collected block, fixes its authority, encodes it again and emits HEADERS (and CONTINUATION)
    /// frames of at most [`MAX_FRAME`] bytes.
    fn finish_block(&mut self) -> io::Result<()> {
        let Some(block) = self.block.take() else {
            return Ok(());
        };
        let mut fields = self
            .decoder
            .decode(&block.fragment)
            .map_err(|err| invalid(format!("decoding a header block: {err:?}")))?;
        for (name, value) in &mut fields {
            if name.as_slice() == b":authority" && !valid_authority(value) {
                tracing::trace!(
                    authority = %String::from_utf8_lossy(value),
                    "a unix-socket client sent an authority h2 refuses; it is read as localhost"
                );
                *value = UNIX_AUTHORITY.as_bytes().to_vec();
            }
        }
        let encoded = self
            .encoder
            .encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let mut first = true;
        let mut rest = encoded.as_slice();
        loop {
            let room = if first && block.priority.is_some() {
                MAX_FRAME - 5
            } else {
                MAX_FRAME
            };
            let (chunk, after) = rest.split_at(rest.len().min(room));
            let mut flags = if after.is_empty() { END_HEADERS } else { 0 };
            let kind = if first {
                if block.end_stream {
                    flags |= END_STREAM;
                }
                if block.priority.is_some() {
                    flags |= PRIORITY;
                }
                HEADERS
            } else {
                CONTINUATION
            };
            let priority = if first { block.priority } else { None };
            let length = chunk.len() + priority.map_or(0, |p| p.len());
            let length = u32::try_from(length).expect("at most MAX_FRAME").to_be_bytes();
            self.output.extend_from_slice(&length[1..]);
            self.output.push(kind);
            self.output.push(flags);
            self.output.extend_from_slice(&block.stream_id);
            if let Some(priority) = priority {
                self.output.extend_from_slice(&priority);
            }
            self.output.extend_from_slice(chunk);
            first = false;
            rest = after;
            if rest.is_empty() {
                return Ok(());
            }
        }
    }
}

/// A unix socket connection whose incoming request headers are made acceptable to h2 (see the module docs).
pub(crate) struct AuthorityFix<S> {
    inner: S,
    rewriter: Rewriter,
}

impl<S> AuthorityFix<S> {
    /// Wraps a freshly accepted connection.
    pub(crate) fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: Rewriter::new(),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.rewriter.output.is_empty() {
                let n = this.rewriter.output.len().min(buf.remaining());
                buf.put_slice(&this.rewriter.output[..n]);
                this.rewriter.output.drain(..n);
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // End of stream: whatever is left (an incomplete frame) goes on as it is, for h2 to judge.
                    let rest = std::mem::take(&mut this.rewriter.input);
                    if rest.is_empty() {
                        return Poll::Ready(Ok(()));
                    }
                    this.rewriter.output = rest;
                }
                Poll::Ready(Ok(())) => {
                    this.rewriter.input.extend_from_slice(read.filled());
                    if let Err(err) = this.rewriter.process() {
                        return Poll::Ready(Err(err));
                    }
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for AuthorityFix<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = u32::try_from(payload.len()).unwrap().to_be_bytes()[1..].to_vec();
        out.push(kind);
        out.push(flags);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn request(authority: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/mcm.provider.v1.Identity/Probe"),
            (":authority", authority),
            ("content-type", "application/grpc"),
        ]
        .into_iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
    }

    fn encode(encoder: &mut loona_hpack::Encoder<'_>, fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        encoder.encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
    }

    /// Feeds `bytes` through a rewriter in pieces of `step` bytes, as a socket may deliver them.
    fn rewrite(bytes: &[u8], step: usize) -> Vec<u8> {
        let mut rewriter = Rewriter::new();
        for piece in bytes.chunks(step) {
            rewriter.input.extend_from_slice(piece);
            rewriter.process().unwrap();
        }
        assert!(rewriter.input.is_empty(), "every frame was complete");
        rewriter.output
    }

    /// The frames after the preface: (type, flags, stream, payload).
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        assert!(bytes.starts_with(PREFACE));
        bytes = &bytes[PREFACE.len()..];
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let length = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            let stream = u32::from_be_bytes(bytes[5..9].try_into().unwrap());
            out.push((bytes[3], bytes[4], stream, bytes[9..9 + length].to_vec()));
            bytes = &bytes[9 + length..];
        }
        out
    }

    fn authorities(output: &[u8]) -> Vec<String> {
        let mut decoder = loona_hpack::Decoder::new();
        frames(output)
            .into_iter()
            .filter(|f| f.0 == HEADERS)
            .flat_map(|f| decoder.decode(&f.3).unwrap())
            .filter(|(n, _)| n.as_slice() == b":authority")
            .map(|(_, v)| String::from_utf8(v).unwrap())
            .collect()
    }

    #[test]
    fn a_socket_path_authority_becomes_localhost_and_the_rest_is_unchanged() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut bytes = PREFACE.to_vec();
        let settings = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
        bytes.extend_from_slice(&settings);
        // grpc-core's percent-encoded path, then grpc-java's raw path, then the same again from the dynamic table.
        for (stream, authority) in [(1, "tmp%2Fp.sock"), (3, "/tmp/p.sock"), (5, "tmp%2Fp.sock")] {
            let block = encode(&mut encoder, &request(authority));
            bytes.extend(frame(HEADERS, END_HEADERS, stream, &block));
            bytes.extend(frame(0x0, END_STREAM, stream, b"\0\0\0\0\0"));
        }
        for step in [1, 7, bytes.len()] {
            let output = rewrite(&bytes, step);
            assert_eq!(authorities(&output), ["localhost"; 3]);
            let frames = frames(&output);
            assert_eq!(
                frames[0],
                (0x4, 0, 0, settings[9..].to_vec()),
                "SETTINGS passes as it is"
            );
            assert_eq!(
                frames[2],
                (0x0, END_STREAM, 1, b"\0\0\0\0\0".to_vec()),
                "DATA passes as it is"
            );
            assert_eq!(frames.len(), 7);
        }
    }

    #[test]
    fn a_valid_authority_is_kept() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &encode(&mut encoder, &request("provider.invalid")),
        ));
        assert_eq!(authorities(&rewrite(&bytes, 5)), ["provider.invalid"]);
    }

    #[test]
    fn padding_priority_and_continuation_frames_are_read_and_written_back_as_one_block() {
        let mut encoder = loona_hpack::Encoder::new();
        let block = encode(&mut encoder, &request("tmp%2Fp.sock"));
        let (head, tail) = block.split_at(10);
        let mut payload = vec![3u8];
        payload.extend_from_slice(&[0, 0, 0, 0, 16]);
        payload.extend_from_slice(head);
        payload.extend_from_slice(&[0, 0, 0]);
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 1, &payload));
        bytes.extend(frame(CONTINUATION, END_HEADERS, 1, tail));
        let output = rewrite(&bytes, 3);
        let frames = frames(&output);
        assert_eq!(frames.len(), 1);
        let (kind, flags, stream, payload) = &frames[0];
        assert_eq!(
            (*kind, *flags, *stream),
            (HEADERS, END_HEADERS | END_STREAM | PRIORITY, 1)
        );
        assert_eq!(&payload[..5], &[0, 0, 0, 0, 16], "the priority is kept");
        let fields = loona_hpack::Decoder::new().decode(&payload[5..]).unwrap();
        let authority = fields
            .iter()
            .find(|(n, _)| n.as_slice() == b":authority")
            .unwrap();
        assert_eq!(authority.1, b"localhost");
        assert_eq!(fields.len(), 5);
    }

    #[test]
    fn a_connection_that_is_not_http2_passes_unchanged() {
        let bytes = b"GET / HTTP/1.1\r\nhost: a/b\r\n\r\n";
        assert_eq!(rewrite(bytes, 4), bytes);
    }

    #[test]
    fn a_broken_header_block_is_an_error_not_a_panic() {
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        ));
        let mut rewriter = Rewriter::new();
        rewriter.input = bytes;
        let err = rewriter.process().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
