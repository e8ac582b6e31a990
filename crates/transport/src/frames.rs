//! The two halves of a connection that links and inbound connections drive: a `Stream` of frames
//! on the read side, and on the write side a writer that hands each frame to TLS in place, behind
//! its 4-byte big-endian length. A `Framed` sink would first copy every frame into its write
//! buffer: for a 512 KiB fragment that copy was half of a node's instructions per get outside
//! TLS (docs/benchmarks.md); here a frame is copied once, into the record that encrypts it.

use crate::FramedStream;
use bytes::Bytes;
use std::io::{self, IoSlice};
use tokio::io::{AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};

/// Bytes of frames written before one flush: enough to batch small frames, small enough to keep
/// latency.
pub(crate) const BATCH_BYTES: usize = 256 * 1024;

type Tls = tokio_rustls::TlsStream<TcpStream>;

/// The read half: decodes frames exactly as the connection's codec did.
pub(crate) type FrameReader = FramedRead<ReadHalf<Tls>, LengthDelimitedCodec>;

/// Splits a connection into its frame reader and frame writer. Bytes the connection had already
/// read stay in front of the reader.
pub(crate) fn split(framed: FramedStream) -> (FrameReader, FrameWriter<WriteHalf<Tls>>) {
    let max_frame_bytes = framed.codec().max_frame_length();
    let parts = framed.into_parts();
    let (read, write) = tokio::io::split(parts.io);
    let mut reader = FramedRead::new(read, parts.codec);
    reader.read_buffer_mut().extend_from_slice(&parts.read_buf);
    // Nothing is written through a `Framed` before it is split.
    debug_assert!(parts.write_buf.is_empty());
    (
        reader,
        FrameWriter {
            io: write,
            max_frame_bytes,
        },
    )
}

/// Writes frames behind their lengths, without copying them first.
pub(crate) struct FrameWriter<W> {
    io: W,
    max_frame_bytes: usize,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// Writes every frame of `frames`, each behind its length, and flushes. A frame over the
    /// connection's limit fails the write before anything is written: the peer would drop the
    /// connection at its length.
    pub(crate) async fn send_all(&mut self, frames: &[&Bytes]) -> io::Result<()> {
        let mut lengths = Vec::with_capacity(frames.len());
        for frame in frames {
            match u32::try_from(frame.len()) {
                Ok(length) if frame.len() <= self.max_frame_bytes => {
                    lengths.push(length.to_be_bytes())
                }
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "frame of {} bytes exceeds the frame limit of {} bytes",
                            frame.len(),
                            self.max_frame_bytes
                        ),
                    ));
                }
            }
        }
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(2 * frames.len());
        for (length, frame) in lengths.iter().zip(frames) {
            slices.push(IoSlice::new(length));
            // An empty slice at the end would make the stream report a zero-length write.
            if !frame.is_empty() {
                slices.push(IoSlice::new(frame));
            }
        }
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let written = self.io.write_vectored(rest).await?;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, written);
        }
        self.io.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use tokio_util::codec::FramedRead;

    /// A writer that takes at most `step` bytes per call, so frames straddle writes.
    struct Trickle {
        written: Vec<u8>,
        step: usize,
        flushed: bool,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<io::Result<usize>> {
            let n = buf.len().min(self.step);
            self.written.extend_from_slice(&buf[..n]);
            std::task::Poll::Ready(Ok(n))
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            self.flushed = true;
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn frames_read_back_through_the_codec_however_the_stream_cuts_them() {
        let frames = [
            Bytes::from_static(b"first"),
            Bytes::new(),
            Bytes::from(vec![7u8; 70_000]),
            Bytes::from_static(b"last"),
        ];
        let refs: Vec<&Bytes> = frames.iter().collect();
        for step in [1, 3, 4096, usize::MAX] {
            let mut writer = FrameWriter {
                io: Trickle {
                    written: Vec::new(),
                    step,
                    flushed: false,
                },
                max_frame_bytes: 100_000,
            };
            writer.send_all(&refs).await.unwrap();
            assert!(writer.io.flushed);
            let read: Vec<Bytes> =
                FramedRead::new(&writer.io.written[..], crate::frame_codec(100_000))
                    .map(|frame| frame.unwrap().freeze())
                    .collect()
                    .await;
            assert_eq!(read, frames, "step {step}");
        }
    }

    #[tokio::test]
    async fn a_frame_over_the_limit_writes_nothing() {
        let mut writer = FrameWriter {
            io: Trickle {
                written: Vec::new(),
                step: usize::MAX,
                flushed: false,
            },
            max_frame_bytes: 10,
        };
        let small = Bytes::from_static(b"ok");
        let large = Bytes::from(vec![0u8; 11]);
        let error = writer.send_all(&[&small, &large]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        assert!(writer.io.written.is_empty());
    }
}
