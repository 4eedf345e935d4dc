//! Reading a delivery's raw body, never more than the limit: a declared
//! `Content-Length` over the limit is refused before a byte is kept, and a
//! body without one (chunked) is refused as soon as it grows past the limit.
//!
//! A refused body is then read on and dropped, up to [`DRAIN_BYTES`] past the
//! limit for at most [`DRAIN_FOR`], so that a client still sending it reads
//! the 413 instead of a reset connection; a larger or slower one is cut off.

use std::time::Duration;

use axum::body::{Body, BodyDataStream, Bytes};
use axum::http::{header, HeaderMap};
use futures_util::StreamExt;

use super::response::ReceiverRejection;

/// The default body limit: 1 MiB, well above what providers send (Stripe,
/// GitHub and Shopify payloads stay far below it).
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// Most bytes reserved up front, whatever `Content-Length` claims, so that
/// many slow or lying clients cannot make the receiver reserve `limit` each.
const MAX_PREALLOCATION: usize = 64 * 1024;

/// Most bytes past the limit of a refused body read (and dropped) before
/// answering 413.
pub const DRAIN_BYTES: u64 = 1024 * 1024;

/// Longest time spent reading a refused body before answering 413.
pub const DRAIN_FOR: Duration = Duration::from_secs(1);

/// The raw body, exactly as received, or why it was refused.
pub(crate) async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ReceiverRejection> {
    let too_large = ReceiverRejection::PayloadTooLarge { limit };
    let declared = declared_length(headers);
    let mut stream = body.into_data_stream();
    if let Some(length) = declared.filter(|length| *length > limit as u64) {
        if length <= (limit as u64).saturating_add(DRAIN_BYTES) {
            drain(&mut stream, length).await;
        }
        return Err(too_large);
    }
    let capacity = declared
        .and_then(|length| usize::try_from(length).ok())
        .unwrap_or(0)
        .min(MAX_PREALLOCATION);
    let mut bytes = Vec::with_capacity(capacity);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|error| {
            tracing::debug!(%error, "request body could not be read");
            ReceiverRejection::UnreadableBody
        })?;
        if bytes.len().saturating_add(chunk.len()) > limit {
            drain(&mut stream, DRAIN_BYTES).await;
            return Err(too_large);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(bytes))
}

/// Read and drop the rest of a refused body: at most `budget` bytes, for at
/// most [`DRAIN_FOR`].
async fn drain(stream: &mut BodyDataStream, budget: u64) {
    let mut left = budget;
    let _ = tokio::time::timeout(DRAIN_FOR, async {
        while let Some(Ok(chunk)) = stream.next().await {
            left = left.saturating_sub(chunk.len() as u64);
            if left == 0 {
                break;
            }
        }
    })
    .await;
}

/// The `Content-Length`, when there is one readable value.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(chunks: Vec<&'static [u8]>) -> Body {
        let stream = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|chunk| Ok::<_, std::io::Error>(Bytes::from_static(chunk))),
        );
        Body::from_stream(stream)
    }

    #[tokio::test]
    async fn reads_up_to_the_limit_exactly() {
        let body = read_limited(&HeaderMap::new(), chunked(vec![b"abc", b"de"]), 5)
            .await
            .unwrap();
        assert_eq!(&body[..], b"abcde");
    }

    #[tokio::test]
    async fn a_chunked_body_over_the_limit_is_refused_while_read() {
        let error = read_limited(&HeaderMap::new(), chunked(vec![b"abc", b"def"]), 5)
            .await
            .unwrap_err();
        assert_eq!(error.code(), "payload_too_large");
    }

    #[tokio::test]
    async fn a_declared_length_over_the_limit_is_refused_up_front() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, "6".parse().unwrap());
        // The body itself would fit: only the header is looked at.
        let error = read_limited(&headers, Body::from("abc"), 5)
            .await
            .unwrap_err();
        assert_eq!(error.code(), "payload_too_large");
    }

    #[tokio::test]
    async fn a_refused_body_is_drained_only_so_far() {
        // An endless body: refused, drained up to the budget, answered.
        let endless = futures_util::stream::repeat_with(|| {
            Ok::<_, std::io::Error>(Bytes::from_static(&[b' '; 4096]))
        });
        let error = read_limited(&HeaderMap::new(), Body::from_stream(endless), 100)
            .await
            .unwrap_err();
        assert_eq!(error.code(), "payload_too_large");
        // A body that stalls: answered after DRAIN_FOR.
        let stalled = futures_util::stream::iter(vec![Ok::<_, std::io::Error>(
            Bytes::from_static(&[b' '; 200]),
        )])
        .chain(futures_util::stream::pending());
        let started = std::time::Instant::now();
        let error = read_limited(&HeaderMap::new(), Body::from_stream(stalled), 100)
            .await
            .unwrap_err();
        assert_eq!(error.code(), "payload_too_large");
        assert!(started.elapsed() < DRAIN_FOR * 3);
    }

    #[tokio::test]
    async fn a_broken_body_is_unreadable() {
        let stream = futures_util::stream::iter(vec![
            Ok(Bytes::from_static(b"ab")),
            Err(std::io::Error::other("connection reset")),
        ]);
        let error = read_limited(&HeaderMap::new(), Body::from_stream(stream), 100)
            .await
            .unwrap_err();
        assert_eq!(error.code(), "unreadable_body");
    }
}
