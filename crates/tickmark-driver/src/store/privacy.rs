//! What the stores keep for personal data (docs/privacy.md): the keys that
//! sealed payloads and outputs (by id and check value, never the key), the
//! rows a rotation reads and re-seals, and the erasure of every event of a
//! subject. The sealing itself is the engine's (`tickmark-core`'s
//! `privacy`): a store sees sealed text as JSON like any other.

use chrono::{DateTime, Utc};

/// A key that sealed rows of this database: its id and a check value that
/// tells a different key under the same id apart (32 hex digits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredKey {
    /// The key's id, as it is written in each sealed value.
    pub key_id: String,
    /// An HMAC of a fixed text under the key, hex (not the key).
    pub key_check: String,
    /// When an engine first sealed with it.
    pub registered_at: DateTime<Utc>,
}

/// One event's stored values, as a rotation reads them: its payload and
/// its steps' outputs, as text, exactly as stored (a re-seal is written
/// only where the text is still the same).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredValues {
    /// The event's row number.
    pub event_seq: i64,
    /// Its payload, as stored.
    pub payload_json: String,
    /// Its steps' stored outputs, by position.
    pub outputs: Vec<(i32, String)>,
}

/// A value to write back re-sealed: `new_json` in place of `old_json`,
/// only where the stored text is still `old_json`.
#[derive(Debug, Clone, Copy)]
pub struct Reseal<'a> {
    /// The event's row number.
    pub event_seq: i64,
    /// `None`: the payload; `Some(position)`: that step's output.
    pub position: Option<i32>,
    /// What was read.
    pub old_json: &'a str,
    /// What to write.
    pub new_json: &'a str,
}

/// Erase what the events of one subject hold ([`Admin::subject_erase`](super::admin::Admin::subject_erase)).
#[derive(Debug, Clone, Copy)]
pub struct SubjectErase<'a> {
    /// The subject's keyed hash (64 hex digits), as stored with its events.
    pub subject_hash: &'a str,
    /// Who asked (audited).
    pub actor: &'a str,
    /// Why (audited; not personal data).
    pub reason: &'a str,
    /// An event left out: the one whose step asks for the erasure (a
    /// compliance webhook), which is running and is erased by no one.
    pub except_event: Option<i64>,
    /// Most events erased in this call's transaction.
    pub batch: u32,
}

/// What one [`Admin::subject_erase`](super::admin::Admin::subject_erase) call did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErasedBatch {
    /// The events erased now, by row number.
    pub erased: Vec<i64>,
    /// Those of them that had not ended (pending, waiting, dead or parked)
    /// and are now cancelled: they will never run.
    pub cancelled: Vec<i64>,
    /// Events of the subject running under a live lease: left to finish
    /// (or to lose their lease), then erased by a later call.
    pub running: Vec<i64>,
}

/// A page of payloads and the outputs of its events (in event, then
/// position order) as [`StoredValues`]: shared by both stores' pages.
pub fn join_outputs(
    payloads: Vec<(i64, String)>,
    outputs: Vec<(i64, i32, String)>,
) -> Vec<StoredValues> {
    let mut outputs = outputs.into_iter().peekable();
    payloads
        .into_iter()
        .map(|(event_seq, payload_json)| {
            let mut own = Vec::new();
            while let Some((_, position, output)) = outputs.next_if(|(seq, ..)| *seq <= event_seq) {
                own.push((position, output));
            }
            StoredValues {
                event_seq,
                payload_json,
                outputs: own,
            }
        })
        .collect()
}

/// A subject's events (row number, running under a live lease) split into
/// those left running and up to `batch` of the others, to erase now.
pub fn split_live(found: Vec<(i64, bool)>, batch: u32) -> (Vec<i64>, Vec<i64>) {
    let (live, ended): (Vec<_>, Vec<_>) = found.into_iter().partition(|(_, live)| *live);
    let batch = usize::try_from(batch).unwrap_or(usize::MAX);
    (
        live.into_iter().map(|(seq, _)| seq).collect(),
        ended.into_iter().take(batch).map(|(seq, _)| seq).collect(),
    )
}
