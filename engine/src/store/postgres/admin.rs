//! The operator side of the postgres store (see `store::admin`).

use std::time::Duration;

use super::PostgresStore;
use crate::store::admin::{
    Actor, Admin, AdminError, AuditEntry, EventFilter, RetryRequest, StatusReport,
};
use crate::store::{EventRecord, StoreError};

fn not_yet() -> StoreError {
    StoreError::Corrupt("operator actions are not built yet".into())
}

#[async_trait::async_trait]
impl Admin for PostgresStore {
    async fn status(&self, _minutes: u32) -> Result<StatusReport, StoreError> {
        Err(not_yet())
    }

    async fn event_list(&self, _filter: &EventFilter) -> Result<Vec<EventRecord>, StoreError> {
        Err(not_yet())
    }

    async fn event_lookup(
        &self,
        _id: &str,
        _source: Option<&str>,
    ) -> Result<Vec<EventRecord>, StoreError> {
        Err(not_yet())
    }

    async fn audit_list(&self, _event_seq: i64) -> Result<Vec<AuditEntry>, StoreError> {
        Err(not_yet())
    }

    async fn event_retry(&self, _request: &RetryRequest<'_>) -> Result<EventRecord, AdminError> {
        Err(not_yet().into())
    }

    async fn event_cancel(
        &self,
        _event_seq: i64,
        _actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        Err(not_yet().into())
    }

    async fn step_skip(
        &self,
        _event_seq: i64,
        _step: &str,
        _actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        Err(not_yet().into())
    }

    async fn step_mark_done_by_hand(
        &self,
        _event_seq: i64,
        _step: &str,
        _actor: Actor<'_>,
    ) -> Result<EventRecord, AdminError> {
        Err(not_yet().into())
    }

    async fn event_prune(
        &self,
        _older_than: Duration,
        _include_dead: bool,
        _batch: u32,
    ) -> Result<u64, StoreError> {
        Err(not_yet())
    }

    async fn sources(&self) -> Result<Vec<String>, StoreError> {
        Err(not_yet())
    }
}
