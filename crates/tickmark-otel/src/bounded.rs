//! The export queue's bound, counted: a span that would not fit is dropped
//! and counted, never waited for, so export never blocks or slows a step.
//!
//! The SDK's batch processor already drops a span its full queue cannot
//! take, but counts it only in a log line at shutdown. This pair keeps the
//! count itself: [`BoundedProcessor`] admits a sampled span only while
//! fewer than `capacity` admitted spans have not reached the exporter
//! ([`CountedExporter`] counts them out), and the batch processor's own
//! queue is as long as `capacity`, so it never drops one of them itself.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};

/// What became of the spans the process ended.
#[derive(Debug, Default)]
pub struct SpanCounts {
    /// Admitted, not yet handed to the exporter.
    queued: AtomicUsize,
    dropped: AtomicU64,
    exported: AtomicU64,
    failed: AtomicU64,
}

impl SpanCounts {
    /// Spans dropped because the export queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Spans the collector accepted.
    pub fn exported(&self) -> u64 {
        self.exported.load(Ordering::Relaxed)
    }

    /// Spans whose export failed (the collector was down or refused them).
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

/// A span processor that bounds what waits for export (see the module).
#[derive(Debug)]
pub struct BoundedProcessor<P> {
    inner: P,
    capacity: usize,
    counts: Arc<SpanCounts>,
}

impl<P> BoundedProcessor<P> {
    /// Admit at most `capacity` spans into `inner` that its exporter has
    /// not taken yet (`inner`'s exporter is a [`CountedExporter`] on
    /// `counts`).
    pub fn new(inner: P, capacity: usize, counts: Arc<SpanCounts>) -> Self {
        Self {
            inner,
            capacity,
            counts,
        }
    }
}

impl<P: SpanProcessor> SpanProcessor for BoundedProcessor<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            // Not exported: the batch processor lets it go.
            return;
        }
        if self.counts.queued.fetch_add(1, Ordering::Relaxed) >= self.capacity {
            self.counts.queued.fetch_sub(1, Ordering::Relaxed);
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// An exporter that counts the spans it is handed out of the queue, and
/// whether the collector took them.
#[derive(Debug)]
pub struct CountedExporter<E> {
    inner: E,
    counts: Arc<SpanCounts>,
}

impl<E> CountedExporter<E> {
    /// Count `inner`'s exports on `counts`.
    pub fn new(inner: E, counts: Arc<SpanCounts>) -> Self {
        Self { inner, counts }
    }
}

impl<E: SpanExporter> SpanExporter for CountedExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        self.counts.queued.fetch_sub(spans, Ordering::Relaxed);
        let result = self.inner.export(batch).await;
        let count = if result.is_ok() {
            &self.counts.exported
        } else {
            &self.counts.failed
        };
        count.fetch_add(spans as u64, Ordering::Relaxed);
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}
