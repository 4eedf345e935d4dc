//! `tickmark keys`: make a key, see which keys sealed the database, and
//! rotate: re-seal every payload and output with the current key, then
//! retire the older keys (docs/privacy.md).

use clap::{Args, Subcommand};
use serde::Serialize;

use super::progress_line::ProgressLine;
use super::{Failure, Output};
use tickmark_core::privacy::{rotate_keys, Keyring, PrivacyError, RotateReport, KEYS_VAR};
use tickmark_driver::store::privacy::RegisteredKey;
use tickmark_driver::store::{Backend, Store};

#[derive(Debug, Subcommand)]
pub(crate) enum KeysCommand {
    /// Print a new random key (32 bytes, base64) for TICKMARK_KEYS or TICKMARK_SUBJECT_KEY
    #[command(after_help = "\
Needs no database. Keep keys where your other secrets are; the database stores only each
encryption key's id and a check value.

Examples:
  echo \"TICKMARK_KEYS=k1:$(tickmark keys new)\"
  echo \"TICKMARK_SUBJECT_KEY=$(tickmark keys new)\"")]
    New,
    /// The keys that sealed this database's rows, and whether TICKMARK_KEYS has each
    #[command(after_help = "\
Example:
  tickmark keys status")]
    Status,
    /// Re-seal every payload and output with the current key (the first of TICKMARK_KEYS)
    #[command(after_help = "\
Rotating a key:
  1. Put the new key first in TICKMARK_KEYS, the old ones after it:
       TICKMARK_KEYS=k2:<new>,k1:<old>
     and deploy it to every process (workers, receivers, the dashboard). New payloads and
     outputs are sealed with k2 from then on; k1 still opens the older ones.
  2. Run `tickmark keys rotate` with the same TICKMARK_KEYS. It re-seals, in batches, every
     value not sealed with k2 (values stored in clear, before encryption was turned on,
     too), each only where it is still what it read, so it runs beside a live fleet. A
     second pass checks that nothing is left; then k1 is retired.
  3. Remove k1 from TICKMARK_KEYS.

Killed at any point, it loses nothing: run it again. When its second pass still finds
values under an older key (written meanwhile by a process whose current key is the old
one), it retires nothing: deploy the new key everywhere, then run it again.

Examples:
  TICKMARK_KEYS=k2:...,k1:... tickmark keys rotate
  tickmark keys rotate --batch 200 --progress")]
    Rotate(RotateArgs),
}

#[derive(Debug, Args)]
pub(crate) struct RotateArgs {
    /// Events read and re-sealed per transaction
    #[arg(long, default_value_t = 500)]
    batch: u32,
    /// Print progress on stderr even when it is not a terminal
    #[arg(long)]
    progress: bool,
}

#[derive(Serialize)]
struct Status {
    configured: Vec<String>,
    registered: Vec<RegisteredKeyRow>,
}

#[derive(Serialize)]
struct RegisteredKeyRow {
    key_id: String,
    registered_at: chrono::DateTime<chrono::Utc>,
    configured: bool,
}

#[derive(Serialize)]
struct NewKey {
    key: String,
}

/// `keys new`, which needs no database.
pub(crate) fn new_key(out: Output) -> Result<(), Failure> {
    let key = Keyring::new_key();
    out.emit(&NewKey { key: key.clone() }, || format!("{key}\n"))
}

pub(crate) async fn run(
    store: &dyn Store,
    out: Output,
    command: KeysCommand,
) -> Result<(), Failure> {
    match command {
        KeysCommand::New => new_key(out),
        KeysCommand::Status => status(store, out).await,
        KeysCommand::Rotate(args) => rotate(store, out, args).await,
    }
}

fn keyring() -> Result<Option<Keyring>, Failure> {
    Keyring::from_env().map_err(|error| Failure::Usage(error.to_string()))
}

async fn status(store: &dyn Store, out: Output) -> Result<(), Failure> {
    let keys = keyring()?;
    let configured: Vec<String> = keys
        .as_ref()
        .map(|keys| keys.ids().map(str::to_owned).collect())
        .unwrap_or_default();
    let registered: Vec<RegisteredKey> = store.keys_registered().await.map_err(Failure::from)?;
    let status = Status {
        registered: registered
            .into_iter()
            .map(|key| RegisteredKeyRow {
                configured: configured.contains(&key.key_id),
                key_id: key.key_id,
                registered_at: key.registered_at,
            })
            .collect(),
        configured,
    };
    out.emit(&status, || {
        let mut text = String::new();
        if status.registered.is_empty() {
            text.push_str("no key has sealed this database's rows: payloads are stored in clear\n");
        }
        for key in &status.registered {
            text.push_str(&format!(
                "{}  sealing since {}  {}\n",
                key.key_id,
                key.registered_at.format("%Y-%m-%d %H:%M:%S UTC"),
                if key.configured {
                    "in TICKMARK_KEYS"
                } else {
                    "MISSING from TICKMARK_KEYS: rows sealed with it cannot be read"
                }
            ));
        }
        match status.configured.first() {
            Some(current) => text.push_str(&format!(
                "current key (seals new values): {current}; TICKMARK_KEYS has {}\n",
                status.configured.join(", ")
            )),
            None => text.push_str("TICKMARK_KEYS is not set here\n"),
        }
        text
    })
}

async fn rotate(store: &dyn Store, out: Output, args: RotateArgs) -> Result<(), Failure> {
    let Some(keys) = keyring()? else {
        return Err(Failure::Usage(format!(
            "{KEYS_VAR} is not set: set it to the new key first, then the old ones \
             (`k2:<new>,k1:<old>`; `tickmark keys new` makes a key)"
        )));
    };
    if args.batch == 0 {
        return Err(Failure::Usage("--batch must be at least 1".to_owned()));
    }
    let current = keys.current_id().to_owned();
    let line = ProgressLine::new(args.progress);
    let report = rotate_keys(store, keys, args.batch, |at| {
        line.show(&format!(
            "pass {}: {} events read, {} values re-sealed with {current} (up to row {})",
            at.pass, at.events, at.resealed, at.last_seq
        ));
    })
    .await;
    line.finish();
    let report: RotateReport = report.map_err(|error| match error {
        PrivacyError::Store(error) => Failure::from(error),
        other => Failure::Refused(other.to_string()),
    })?;
    #[derive(Serialize)]
    struct Rotated<'a> {
        current: &'a str,
        resealed: u64,
        skipped: u64,
        retired: &'a [String],
    }
    let rotated = Rotated {
        current: &current,
        resealed: report.resealed,
        skipped: report.skipped,
        retired: &report.retired,
    };
    out.emit(&rotated, || {
        let mut text = format!(
            "re-sealed {} values with {current}; {} changed meanwhile and were left as written\n",
            report.resealed, report.skipped
        );
        if report.retired.is_empty() {
            text.push_str("no key retired\n");
        } else {
            text.push_str(&format!(
                "retired {}: no value is sealed with it; remove it from TICKMARK_KEYS\n",
                report.retired.join(", ")
            ));
            if store.backend() == Backend::Sqlite {
                text.push_str(
                    "SQLite: pages the rows moved out of may still hold the old ciphertext: \
                     run `VACUUM` when the file may be locked for a while (docs/privacy.md)\n",
                );
            }
        }
        text
    })
}
