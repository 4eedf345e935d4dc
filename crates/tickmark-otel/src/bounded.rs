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

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::sync::Mutex;

    use opentelemetry::trace::{Tracer, TracerProvider as _};
    use opentelemetry_sdk::trace::{
        BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanExporter,
    };

    use super::*;

    /// A collector that takes each export only when the test lets it: while
    /// it is held, everything the process ends waits in the queue.
    #[derive(Debug)]
    struct HeldCollector {
        release: Mutex<mpsc::Receiver<()>>,
    }

    impl SpanExporter for HeldCollector {
        async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
            let release = self.release.lock().unwrap();
            // The test's sender is dropped once it lets go: every later
            // export passes at once.
            let _ = release.recv();
            Ok(())
        }
    }

    /// Ending spans never waits for a stuck collector: past the queue's
    /// bound they are dropped and counted, and every span is either
    /// exported once the collector answers or counted as dropped.
    #[test]
    fn a_stuck_collector_drops_and_counts_and_never_blocks_the_caller() {
        const CAPACITY: usize = 4;
        const SPANS: u64 = 100;
        let (let_go, release) = mpsc::channel();
        let counts = Arc::new(SpanCounts::default());
        let exporter = CountedExporter::new(
            HeldCollector {
                release: Mutex::new(release),
            },
            Arc::clone(&counts),
        );
        let batches = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_max_queue_size(CAPACITY)
                    .with_max_export_batch_size(2)
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BoundedProcessor::new(
                batches,
                CAPACITY,
                Arc::clone(&counts),
            ))
            .build();
        let tracer = provider.tracer("test");
        for _ in 0..SPANS {
            tracer.in_span("step", |_| {});
        }
        // At most the queue and the batch held by the stuck export got in.
        let admitted = SPANS - counts.dropped();
        assert!(
            admitted <= (CAPACITY + 2) as u64,
            "{admitted} spans admitted past a queue of {CAPACITY}"
        );
        assert_eq!(counts.exported(), 0, "the collector has taken nothing yet");

        drop(let_go);
        provider.shutdown().unwrap();
        assert_eq!(counts.exported() + counts.dropped(), SPANS);
        assert_eq!(counts.failed(), 0);
    }
}
