//! `render_invoice`: a long step. It works for `--render-secs` (in small
//! slices, returning early when cancelled; the engine renews the lease
//! meanwhile), then writes `<out-dir>/<event id>.txt` atomically — a temp
//! file in the same folder, synced, then renamed over the target — so a
//! re-run after a crash overwrites the same file and a reader never sees half
//! of one.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::{Step, StepContext, StepError, StepResult};

use super::{Invoice, Settings};

/// How often a long render checks whether it was cancelled.
const SLICE: Duration = Duration::from_millis(100);

/// Renders the invoice to a text file. Output: `{"path", "bytes"}`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct RenderInvoice;

#[typetag::serde(name = "payments.render_invoice")]
#[async_trait::async_trait]
impl Step for RenderInvoice {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let settings = ctx.resource::<Settings>()?.clone();
        let invoice = Invoice::from_event(ctx.event())?;

        let started = Instant::now();
        while started.elapsed() < settings.render_for {
            if ctx.is_cancelled() {
                return Err(StepError::retryable(
                    "cancelled while rendering; the next attempt starts over",
                ));
            }
            let left = settings.render_for.saturating_sub(started.elapsed());
            tokio::time::sleep(left.min(SLICE)).await;
        }

        let event = ctx.event();
        let balance = ctx
            .output("credit_account")
            .and_then(|credit| credit["balance"].as_i64());
        let receipt = match ctx.output("send_receipt") {
            Some(output) if output["sent"] == true => "sent",
            Some(_) => "skipped",
            None => "unknown",
        };
        let text = format!(
            "INVOICE\n\
             event:        {event_id}\n\
             invoice:      {invoice_id}\n\
             customer:     {customer}\n\
             amount paid:  {amount} {currency}\n\
             balance now:  {balance}\n\
             receipt:      {receipt}\n\
             received at:  {received_at}\n\
             rendered by:  {key}\n",
            event_id = event.id,
            invoice_id = invoice.id.as_deref().unwrap_or("-"),
            customer = invoice.customer,
            amount = invoice.amount_paid,
            currency = invoice.currency.as_deref().unwrap_or(""),
            balance = balance.map_or_else(|| "-".to_owned(), |b| b.to_string()),
            received_at = event.received_at.to_rfc3339(),
            key = ctx.idempotency_key(),
        );
        let path = settings.out_dir.join(invoice_file_name(&event.id));
        let bytes = text.len();
        let target = path.clone();
        tokio::task::spawn_blocking(move || write_atomically(&target, text.as_bytes()))
            .await
            .map_err(|error| {
                StepError::retryable(format!("writing the invoice stopped: {error}"))
            })??;
        Ok(json!({ "path": path.display().to_string(), "bytes": bytes }))
    }
}

/// `<event id>.txt`, with every byte outside `[A-Za-z0-9_-]` (and a leading
/// `.`) written as `%XX`, so any id is one safe file name and different ids
/// never share one.
pub fn invoice_file_name(event_id: &str) -> String {
    let mut name = String::with_capacity(event_id.len() + 4);
    for (i, byte) in event_id.bytes().enumerate() {
        let plain =
            byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' || (byte == b'.' && i > 0);
        if plain {
            name.push(char::from(byte));
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    name.push_str(".txt");
    name
}

/// Write `contents` to `path` through a synced temp file in the same folder
/// and a rename, so the file is either the old one or the whole new one.
fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    std::fs::create_dir_all(&dir)?;
    let mut temp = tempfile::Builder::new()
        .prefix(".invoice-")
        .suffix(".tmp")
        .tempfile_in(&dir)?;
    temp.write_all(contents)?;
    temp.as_file().sync_all()?;
    temp.persist(path).map_err(|error| error.error)?;
    // Make the rename itself durable.
    if let Ok(folder) = std::fs::File::open(&dir) {
        let _ = folder.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_safe_and_distinct() {
        assert_eq!(
            invoice_file_name("evt_1NG8Du2eZvKYlo2C"),
            "evt_1NG8Du2eZvKYlo2C.txt"
        );
        assert_eq!(
            invoice_file_name("../etc/passwd"),
            "%2E.%2Fetc%2Fpasswd.txt"
        );
        assert_eq!(invoice_file_name("a.b"), "a.b.txt");
        assert_ne!(invoice_file_name("a/b"), invoice_file_name("a%2Fb"));
        assert_eq!(invoice_file_name("sha256:ab"), "sha256%3Aab.txt");
    }

    #[test]
    fn a_rewrite_replaces_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out").join("evt.txt");
        write_atomically(&path, b"first version, longer").unwrap();
        write_atomically(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let leftovers = std::fs::read_dir(path.parent().unwrap()).unwrap().count();
        assert_eq!(leftovers, 1, "no temp files left behind");
    }
}
