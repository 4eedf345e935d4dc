//! What the fake API answered, request by request: for tests that assert
//! paging (which cursors a client sent) and backoff (how it retried).

/// One answered API request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiRequest {
    /// The method, `GET`.
    pub method: String,
    /// The path, `/v1/events`.
    pub path: String,
    /// The raw query string, as sent (empty when none).
    pub query: String,
    /// The status answered.
    pub status: u16,
    /// When it was answered, by the real clock.
    pub at: std::time::Instant,
}
