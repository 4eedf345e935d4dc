//! Dispatch latency: from `accept` to the first step starting, on an idle
//! engine (no backlog), which measures the wake-up path (LISTEN/NOTIFY or the
//! in-process signal), not polling.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tickmark::{Step, StepContext, StepResult};
use tokio::sync::mpsc;

/// Where the stamp step reports when it started.
pub struct StartTimes {
    sender: mpsc::UnboundedSender<(String, Instant)>,
}

impl StartTimes {
    /// A new channel of start times.
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<(String, Instant)>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (Self { sender }, receiver)
    }
}

/// A step that records when it started.
#[derive(Debug, Serialize, Deserialize)]
pub struct Stamp;

#[typetag::serde(name = "bench.stamp")]
#[async_trait::async_trait]
impl Step for Stamp {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let now = Instant::now();
        let times = ctx.resource::<StartTimes>()?;
        let _ = times.sender.send((ctx.event().id.clone(), now));
        Ok(serde_json::Value::Null)
    }
}

/// Accept `samples` events one at a time, `gap` apart, and return each one's
/// accept-to-start latency.
pub async fn measure(
    engine: &tickmark::Engine,
    receiver: &mut mpsc::UnboundedReceiver<(String, Instant)>,
    samples: usize,
    gap: Duration,
) -> Result<Vec<Duration>, Box<dyn std::error::Error>> {
    let accepted_at: Mutex<HashMap<String, Instant>> = Mutex::default();
    let mut latencies = Vec::with_capacity(samples);
    for n in 0..samples {
        let id = format!("dispatch_{n}");
        let started = Instant::now();
        accepted_at
            .lock()
            .map_err(|_| "poisoned")?
            .insert(id.clone(), started);
        engine
            .accept(tickmark::NewEvent::with_id(
                "dispatch",
                &id,
                "ping",
                serde_json::json!({}),
            ))
            .await?;
        let (ran, at) = tokio::time::timeout(Duration::from_secs(10), receiver.recv())
            .await?
            .ok_or("the worker stopped")?;
        if ran == id {
            latencies.push(at - started);
        }
        tokio::time::sleep(gap).await;
    }
    Ok(latencies)
}
