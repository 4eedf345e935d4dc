//! Reading a delivery's raw body, never more than the limit and never for
//! longer than the body-read timeout: a declared `Content-Length` over the
//! limit is refused before a byte is read, a body without one (chunked) as
//! soon as it grows past the limit, and a body still arriving at the deadline
//! (tower-http's `DeadlineBody`, laid on in `router.rs`) is refused with 408.
//!
//! A body refused unread or half read is answered at once and read on (and
//! dropped) in the background, up to [`DRAIN_BYTES`] for at most
//! [`DRAIN_FOR`] (and never past the body deadline): a client that writes its
//! whole request before reading the answer then reads the 413 or 401 instead
//! of a reset connection, because the server closes only after the client has
//! finished sending. A larger or slower body is cut off. This is hyper's own
//! advice ("read the body or close the connection"), with a bound.

use std::time::Duration;

use axum::body::{Body, BodyDataStream, Bytes};
use axum::http::{header, HeaderMap};
use futures_util::StreamExt;

use super::response::ReceiverRejection;

/// The body limit lives below the receiver: the reconciler's pulled events
/// meet it too.
pub use tickmark_core::event_limits::DEFAULT_BODY_LIMIT;

/// Most bytes reserved up front, whatever `Content-Length` claims, so that
/// many slow or lying clients cannot make the receiver reserve `limit` each.
const MAX_PREALLOCATION: usize = 64 * 1024;

/// Most bytes of a refused body read (and dropped) after answering.
pub const DRAIN_BYTES: u64 = 4 * 1024 * 1024;

/// Longest time spent reading a refused body after answering.
pub const DRAIN_FOR: Duration = Duration::from_secs(5);

/// 413 when the declared `Content-Length` is over `limit`: nothing read yet.
pub(crate) fn declared_too_large(headers: &HeaderMap, limit: usize) -> Option<ReceiverRejection> {
    declared_length(headers)
        .filter(|length| *length > limit as u64)
        .map(|_| ReceiverRejection::PayloadTooLarge { limit })
}

/// The raw body, exactly as received, or why it was refused. A body refused
/// for its size is drained in the background ([`discard`]).
pub(crate) async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, ReceiverRejection> {
    let capacity = declared_length(headers)
        .and_then(|length| usize::try_from(length).ok())
        .unwrap_or(0)
        .min(MAX_PREALLOCATION)
        .min(limit);
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::with_capacity(capacity);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|error| {
            if is_timeout(&error) {
                ReceiverRejection::BodyTimeout {
                    limit_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                }
            } else {
                tracing::debug!(%error, "request body could not be read");
                ReceiverRejection::UnreadableBody
            }
        })?;
        if bytes.len().saturating_add(chunk.len()) > limit {
            drain_in_background(stream);
            return Err(ReceiverRejection::PayloadTooLarge { limit });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(bytes))
}

/// Drop a body that will not be read, after reading it to its end in the
/// background when that is cheap (see the module documentation): at once
/// when it declares more than [`DRAIN_BYTES`].
pub(crate) fn discard(headers: &HeaderMap, body: Body) {
    if declared_length(headers).is_some_and(|length| length > DRAIN_BYTES) {
        return;
    }
    drain_in_background(body.into_data_stream());
}

/// Read and drop the rest of a refused body on another task: at most
/// [`DRAIN_BYTES`], for at most [`DRAIN_FOR`].
fn drain_in_background(mut stream: BodyDataStream) {
    tokio::spawn(async move {
        let mut left = DRAIN_BYTES;
        let _ = tokio::time::timeout(DRAIN_FOR, async {
            while let Some(Ok(chunk)) = stream.next().await {
                left = left.saturating_sub(chunk.len() as u64);
                if left == 0 {
                    break;
                }
            }
        })
        .await;
    });
}

/// Whether a body error is the body deadline running out.
fn is_timeout(error: &axum::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if error.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cause = error.source();
    }
    false
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

    const NO_TIMEOUT: Duration = Duration::from_secs(60);

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
        let body = read_limited(
            &HeaderMap::new(),
            chunked(vec![b"abc", b"de"]),
            5,
            NO_TIMEOUT,
        )
        .await
        .unwrap();
        assert_eq!(&body[..], b"abcde");
    }

    #[tokio::test]
    async fn a_chunked_body_over_the_limit_is_refused_while_read() {
        let error = read_limited(
            &HeaderMap::new(),
            chunked(vec![b"abc", b"def"]),
            5,
            NO_TIMEOUT,
        )
        .await
        .unwrap_err();
        assert_eq!(error.code(), "payload_too_large");
    }

    #[test]
    fn a_declared_length_over_the_limit_is_refused_up_front() {
        let mut headers = HeaderMap::new();
        assert!(declared_too_large(&headers, 5).is_none());
        headers.insert(header::CONTENT_LENGTH, "5".parse().unwrap());
        assert!(declared_too_large(&headers, 5).is_none());
        headers.insert(header::CONTENT_LENGTH, "6".parse().unwrap());
        assert_eq!(
            declared_too_large(&headers, 5).unwrap().code(),
            "payload_too_large"
        );
    }

    #[tokio::test]
    async fn a_refused_body_is_answered_before_it_is_drained() {
        // An endless body: refused at once, drained in the background.
        let endless = futures_util::stream::repeat_with(|| {
            Ok::<_, std::io::Error>(Bytes::from_static(&[b' '; 4096]))
        });
        let error = read_limited(
            &HeaderMap::new(),
            Body::from_stream(endless),
            100,
            NO_TIMEOUT,
        )
        .await
        .unwrap_err();
        assert_eq!(error.code(), "payload_too_large");
        // A body that stalls after the limit: answered at once too.
        let stalled = futures_util::stream::iter(vec![Ok::<_, std::io::Error>(
            Bytes::from_static(&[b' '; 200]),
        )])
        .chain(futures_util::stream::pending());
        let error = tokio::time::timeout(
            DRAIN_FOR / 2,
            read_limited(
                &HeaderMap::new(),
                Body::from_stream(stalled),
                100,
                NO_TIMEOUT,
            ),
        )
        .await
        .expect("answered without waiting for the drain")
        .unwrap_err();
        assert_eq!(error.code(), "payload_too_large");
    }

    #[tokio::test]
    async fn a_body_past_its_deadline_is_a_timeout() {
        let stalled =
            futures_util::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from_static(b"{"))])
                .chain(futures_util::stream::pending());
        let timeout = Duration::from_millis(50);
        let body = Body::new(tower_http::timeout::DeadlineBody::new(
            timeout,
            Body::from_stream(stalled),
        ));
        let error = read_limited(&HeaderMap::new(), body, 100, timeout)
            .await
            .unwrap_err();
        assert_eq!(error.code(), "body_timeout");
    }

    #[tokio::test]
    async fn a_broken_body_is_unreadable() {
        let stream = futures_util::stream::iter(vec![
            Ok(Bytes::from_static(b"ab")),
            Err(std::io::Error::other("connection reset")),
        ]);
        let error = read_limited(
            &HeaderMap::new(),
            Body::from_stream(stream),
            100,
            NO_TIMEOUT,
        )
        .await
        .unwrap_err();
        assert_eq!(error.code(), "unreadable_body");
    }
}
