//! `tickmark keys rotate`: re-seal every stored payload and output with the
//! current key (sealing, too, what was stored in clear before encryption
//! was turned on), in batches, each value only where it is still what was
//! read; then, when a pass finds nothing left under an older key, retire
//! the older keys. Killed at any point, it loses nothing: each batch is one
//! transaction, and a new run starts over, skipping what is current.

use tickmark_driver::store::privacy::Reseal;
use tickmark_driver::store::Store;

use super::envelope::{self, sealed_with};
use super::{Keyring, Privacy, PrivacyError};

/// Where a rotation is: after each batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RotateProgress {
    /// Which pass (1: re-seal; 2: check that nothing is left).
    pub pass: u32,
    /// Events read in this pass.
    pub events: u64,
    /// Values re-sealed in this pass.
    pub resealed: u64,
    /// The last event row read.
    pub last_seq: i64,
}

/// What a rotation did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RotateReport {
    /// Values re-sealed with the current key, over both passes.
    pub resealed: u64,
    /// Values changed by someone else between read and write (left as they
    /// were written: by a worker, with its current key).
    pub skipped: u64,
    /// The keys retired: no value is sealed with them any more.
    pub retired: Vec<String>,
}

/// Re-seal every value in `store` with `keys`' current key, `batch` events
/// at a time, calling `progress` after each batch.
pub async fn rotate_keys(
    store: &dyn Store,
    keys: Keyring,
    batch: u32,
    mut progress: impl FnMut(RotateProgress),
) -> Result<RotateReport, PrivacyError> {
    let privacy = Privacy::new().with_keys(keys);
    privacy.check(store, false).await?;
    let keys = privacy.keys().expect("set above");
    let mut report = RotateReport::default();
    for pass in 1..=2 {
        let mut at = RotateProgress {
            pass,
            ..RotateProgress::default()
        };
        let mut found_old = 0;
        loop {
            let page = store.values_page(at.last_seq, batch).await?;
            let Some(last) = page.last() else { break };
            at.last_seq = last.event_seq;
            at.events += page.len() as u64;
            let mut fresh: Vec<(i64, Option<i32>, String, String)> = Vec::new();
            for row in &page {
                let values = std::iter::once((None, &row.payload_json))
                    .chain(row.outputs.iter().map(|(pos, json)| (Some(*pos), json)));
                for (position, json) in values {
                    if let Some(new_json) = resealed(keys, json)? {
                        fresh.push((row.event_seq, position, json.clone(), new_json));
                    }
                }
            }
            found_old += fresh.len() as u64;
            let reseals: Vec<Reseal<'_>> = fresh
                .iter()
                .map(|(event_seq, position, old_json, new_json)| Reseal {
                    event_seq: *event_seq,
                    position: *position,
                    old_json,
                    new_json,
                })
                .collect();
            let written = store.values_reseal(&reseals).await?;
            at.resealed += written;
            report.resealed += written;
            report.skipped += reseals.len() as u64 - written;
            progress(at);
        }
        if pass == 2 && found_old == 0 {
            for key in store.keys_registered().await? {
                if key.key_id != keys.current_id() {
                    store.key_retire(&key.key_id).await?;
                    report.retired.push(key.key_id);
                }
            }
        }
    }
    Ok(report)
}

/// `json` sealed with the current key, unless it is already.
fn resealed(keys: &Keyring, json: &str) -> Result<Option<String>, PrivacyError> {
    let value: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| PrivacyError::Malformed(format!("stored JSON: {e}")))?;
    if sealed_with(&value) == Some(keys.current_id()) {
        return Ok(None);
    }
    let plain = envelope::open(Some(keys), &value)?.unwrap_or(value);
    Ok(Some(envelope::seal(keys, &plain.to_string())))
}
