//! A connection's write deadline: the server's answers must be taken.
//!
//! hyper's header-read timer runs only while hyper waits for a request head.
//! A client that pipelines requests and never reads its answers keeps hyper
//! waiting to *write* instead: the socket's send buffer is full, hyper stops
//! reading, and no timer of hyper's runs, so the connection (and its share of
//! the connection caps) is held for ever. This wrapper gives the write side
//! a deadline of its own: from the moment the socket refuses bytes until the
//! moment everything the server had to write is taken (a flush completes, or
//! a write takes all it was offered), at most [`Limits::write_timeout`]; past
//! it, every write fails with `TimedOut` and hyper closes the connection.
//!
//! Why hand-written: neither hyper nor tower-http has a write-side timeout for
//! a server connection (tower-http's timeouts cover the request body and the
//! handler, not the socket), and this is a dozen lines around tokio's timer.
//! A client that reads its answers at any ordinary pace never meets it: the
//! deadline only runs while the socket refuses bytes.
//!
//! [`Limits::write_timeout`]: super::Limits::write_timeout

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `io` whose writes fail with [`io::ErrorKind::TimedOut`] once they have
/// waited `timeout` for the peer to take bytes.
#[derive(Debug)]
pub struct WriteDeadline<Io> {
    io: Io,
    timeout: Duration,
    /// Armed when the socket first refuses bytes; disarmed when everything
    /// offered has been taken.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<Io> WriteDeadline<Io> {
    pub fn new(io: Io, timeout: Duration) -> Self {
        Self {
            io,
            timeout,
            stalled: None,
        }
    }

    /// The socket refused bytes: wait, unless the deadline has passed.
    fn refused<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let timeout = self.timeout;
        let deadline = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took none of the answer within the write timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for WriteDeadline<Io> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<Io> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write(cx, buf) {
            Poll::Pending => self.refused(cx),
            Poll::Ready(Ok(written)) => {
                if written == buf.len() {
                    self.stalled = None;
                }
                Poll::Ready(Ok(written))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.refused(cx),
            Poll::Ready(Ok(written)) => {
                if written == bufs.iter().map(|buf| buf.len()).sum::<usize>() {
                    self.stalled = None;
                }
                Poll::Ready(Ok(written))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Pending => self.refused(cx),
            Poll::Ready(flushed) => {
                self.stalled = None;
                Poll::Ready(flushed)
            }
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.io).poll_shutdown(cx) {
            Poll::Pending => self.refused(cx),
            Poll::Ready(done) => Poll::Ready(done),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn writes_nobody_takes_time_out_and_writes_taken_never_do() {
        // A pipe that holds 16 bytes: a reader that never reads.
        let (near, _far) = tokio::io::duplex(16);
        let mut io = WriteDeadline::new(near, Duration::from_secs(10));
        io.write_all(&[0; 16]).await.unwrap();
        let started = tokio::time::Instant::now();
        let error = io.write_all(&[0; 1]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_keeps_up_resets_the_deadline() {
        use tokio::io::AsyncReadExt;
        let (near, mut far) = tokio::io::duplex(16);
        let mut io = WriteDeadline::new(near, Duration::from_secs(10));
        let reader = tokio::spawn(async move {
            let mut buf = [0; 16];
            let mut total = 0;
            // Takes 16 bytes every 9 s: each stall is shorter than the deadline.
            while total < 64 {
                tokio::time::sleep(Duration::from_secs(9)).await;
                total += far.read(&mut buf).await.unwrap();
            }
            total
        });
        for _ in 0..4 {
            io.write_all(&[0; 16]).await.unwrap();
            io.flush().await.unwrap();
        }
        assert_eq!(reader.await.unwrap(), 64);
    }
}
