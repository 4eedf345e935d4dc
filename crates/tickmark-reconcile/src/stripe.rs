//! Stripe: what the receiver missed, from `GET /v1/events`.
//!
//! Stripe keeps every event listable for 30 days and retries a live-mode
//! delivery for up to 3 days; after that, the list is the only copy.
//! <https://docs.stripe.com/api/events/list>,
//! <https://docs.stripe.com/webhooks#retries>
//!
//! The list is newest first. With a cursor (the newest event a run has
//! handled) a run pages *forward*: `ending_before=<cursor>` answers the
//! events just newer than it, still newest first, so each page is handled
//! oldest first and the cursor moves to the page's newest event once the
//! whole page is in the inbox: a run killed mid-page resumes with that page.
//! With no cursor (a first run), or when asked for a window (`--since`), it
//! pages *back* from now with `starting_after`, holding only the last page,
//! down to the window's oldest page; records it oldest first, then pages
//! forward from it as above: every event is recorded after every older one.
//! A window moves the cursor only when it reaches back to the old cursor
//! (no gap is skipped). A page that makes no progress (repeats, goes the
//! wrong way, is empty and claims more) ends the run.
//! <https://docs.stripe.com/api/pagination>
//!
//! A pulled event is recorded as the receiver records a pushed one: the
//! source, the event's `id` (the dedup key) and its `type`, with the event
//! object as the payload. So a pushed and a pulled copy are one event.

use std::time::Duration;

use chrono::{DateTime, Utc};

use http::header::AUTHORIZATION;
use serde::Deserialize;

use super::api_client::{ApiRequest, ApiResponse};
use super::base_url::trailing_slash;
use super::error::ReconcileError;
use super::kind_filter::KindFilter;
use super::run_context::RunContext;
use super::stripe_account::{check_lost_cursor, SourceAccount};
use super::stripe_api::{StripeApi, EVENTS_HORIZON, MAX_TYPES};

/// One page of `GET /v1/events`.
#[derive(Debug, Deserialize)]
struct EventPage {
    data: Vec<serde_json::Value>,
    has_more: bool,
}

/// The fields of an event a run reads; the whole object is the payload.
#[derive(Debug, Deserialize)]
struct EventHead {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    created: i64,
}

/// Where a page starts.
enum PageFrom<'a> {
    /// The events just newer than this one.
    NewerThan(&'a str),
    /// The events just older than this one, or (`None`) the newest.
    OlderThan(Option<&'a str>),
}

/// Why a forward run could not start from its cursor.
enum Forward {
    Done,
    /// Stripe no longer has the cursor's event (past the horizon).
    CursorGone,
}

/// An event a page starts from: its id and, when known, when it was made.
#[derive(Debug, Clone)]
struct Mark {
    id: String,
    created: Option<i64>,
}

/// Whether a forward walk moves the source's cursor as it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CursorMoves {
    /// Page by page: everything older is in the inbox.
    Yes,
    /// Never: a window that does not reach back to the cursor leaves a gap
    /// the cursor must not jump.
    No,
}

/// Pull what the inbox is missing of `run.source` from Stripe.
pub(crate) async fn pull(api: &StripeApi, run: &mut RunContext<'_>) -> Result<(), ReconcileError> {
    let filter = KindFilter::of(run);
    if filter.takes_nothing() {
        run.note("no handler takes any kind of this source: nothing to reconcile".to_owned());
        run.summary.complete = true;
        return Ok(());
    }
    let account = SourceAccount::of(api, run).await?;
    let cursor = run.cursor_id().map(|id| Mark {
        id: id.to_owned(),
        created: run.cursor_at().map(|at| at.timestamp()),
    });
    match (run.request.since, cursor) {
        (Some(since), _) => window(api, run, &filter, &account, since.min(EVENTS_HORIZON)).await,
        (None, None) => window(api, run, &filter, &account, api.first_lookback).await,
        (None, Some(cursor)) => {
            match forward(
                api,
                run,
                &filter,
                &account,
                cursor.clone(),
                CursorMoves::Yes,
            )
            .await?
            {
                Forward::Done => Ok(()),
                Forward::CursorGone => {
                    // Within the 30 days, a cursor Stripe does not know was read
                    // with another account's key: refuse, not 30 days of its events.
                    check_lost_cursor(run, &cursor.id)?;
                    run.note(format!(
                        "Stripe no longer lists the cursor's event {} (older than its 30 days): \
                     read the whole 30 days instead; anything older cannot be recovered",
                        cursor.id
                    ));
                    // The gap behind the 30 days cannot be read: the window
                    // stands in for the cursor, which may move past it.
                    run.cursor = None;
                    window(api, run, &filter, &account, EVENTS_HORIZON).await
                }
            }
        }
    }
}

/// Page forward from `from`, each page oldest first, moving the cursor
/// (when `moves`) after each whole page.
async fn forward(
    api: &StripeApi,
    run: &mut RunContext<'_>,
    filter: &KindFilter,
    account: &SourceAccount,
    mut from: Mark,
    moves: CursorMoves,
) -> Result<Forward, ReconcileError> {
    loop {
        run.check_page_cap()?;
        let request = list_request(api, filter, PageFrom::NewerThan(&from.id), None);
        let response = run.send(&request).await?;
        if response.status.as_u16() == 404 && is_resource_missing(&response) {
            return Ok(Forward::CursorGone);
        }
        let page = page_of(&request, &response)?;
        let heads = heads_of(&request, &page)?;
        check_forward(&request, &from, &page, &heads)?;
        // Newest first: handle the page oldest first.
        for (head, event) in heads.iter().zip(&page.data).rev() {
            take(run, filter, account, head, event).await?;
        }
        if let Some(newest) = heads.first() {
            if moves == CursorMoves::Yes {
                advance_to(run, newest).await?;
            }
            from = Mark {
                id: newest.id.clone(),
                created: Some(newest.created),
            };
        }
        run.page_done();
        if !page.has_more {
            run.summary.complete = true;
            return Ok(Forward::Done);
        }
    }
}

/// A forward page must be newer than where it was asked to start, and an
/// empty one cannot claim more: else reading on would never end (or would
/// move the cursor back).
fn check_forward(
    request: &ApiRequest,
    from: &Mark,
    page: &EventPage,
    heads: &[EventHead],
) -> Result<(), ReconcileError> {
    let stuck = |reason: &str| ReconcileError::NoProgress {
        what: request.what(),
        reason: reason.to_owned(),
    };
    if heads.is_empty() && page.has_more {
        return Err(stuck("an empty page that claims more (has_more: true)"));
    }
    if heads.iter().any(|head| head.id == from.id) {
        return Err(stuck(
            "the page holds the event it was asked for the events newer than (the same page again)",
        ));
    }
    if let Some(created) = from.created {
        if heads.iter().any(|head| head.created < created) {
            return Err(stuck(
                "the page holds events older than the one it was asked for the events newer than (the cursor would go backward)",
            ));
        }
    }
    Ok(())
}

/// A backward page must be older than the last one, and an empty one
/// cannot claim more.
fn check_backward(
    request: &ApiRequest,
    older_than: Option<&EventHead>,
    page: &EventPage,
    heads: &[EventHead],
) -> Result<(), ReconcileError> {
    let stuck = |reason: &str| ReconcileError::NoProgress {
        what: request.what(),
        reason: reason.to_owned(),
    };
    if heads.is_empty() && page.has_more {
        return Err(stuck("an empty page that claims more (has_more: true)"));
    }
    if let Some(last) = older_than {
        if heads.iter().any(|head| head.id == last.id) {
            return Err(stuck(
                "the page holds the event it was asked for the events older than (the same page again)",
            ));
        }
        if heads.iter().any(|head| head.created > last.created) {
            return Err(stuck(
                "the page holds events newer than the one it was asked for the events older than (it went backward)",
            ));
        }
    }
    Ok(())
}

/// Move the cursor to `newest`, unless the cursor is already past it.
async fn advance_to(run: &RunContext<'_>, newest: &EventHead) -> Result<(), ReconcileError> {
    let at = created_at(newest.created);
    if run
        .cursor_at()
        .is_none_or(|cursor_at| at >= Some(cursor_at))
    {
        run.advance(&newest.id, at).await?;
    }
    Ok(())
}

/// The window from `now - since` to now, oldest first, with one page held
/// at a time: page back to the window's oldest page (reading, not
/// recording), record it, then page forward from it. The cursor moves with
/// the forward pages only when the window reaches back to the old cursor
/// (no gap is skipped).
async fn window(
    api: &StripeApi,
    run: &mut RunContext<'_>,
    filter: &KindFilter,
    account: &SourceAccount,
    since: Duration,
) -> Result<(), ReconcileError> {
    let start = run.window_start(since);
    let Some(OldestPage { page, heads, pages }) = oldest_page(api, run, filter, start).await?
    else {
        run.summary.complete = true;
        return Ok(());
    };
    let moves = if run.cursor_at().is_none_or(|at| at >= start) {
        CursorMoves::Yes
    } else {
        CursorMoves::No
    };
    for (head, event) in heads.iter().zip(&page.data).rev() {
        take(run, filter, account, head, event).await?;
    }
    run.report_progress();
    let Some(newest) = heads.first() else {
        run.summary.complete = true;
        return Ok(());
    };
    if moves == CursorMoves::Yes {
        advance_to(run, newest).await?;
    }
    if pages == 1 {
        // The window was one page: what came since, the next run reads.
        run.summary.complete = true;
        return Ok(());
    }
    let from = Mark {
        id: newest.id.clone(),
        created: Some(newest.created),
    };
    match forward(api, run, filter, account, from, moves).await? {
        Forward::Done => Ok(()),
        Forward::CursorGone => Err(ReconcileError::NoProgress {
            what: "GET /v1/events".to_owned(),
            reason: format!(
                "the window's event {} dropped out of Stripe's 30 days while the run read it; \
                 run again (a shorter --since avoids the edge)",
                newest.id
            ),
        }),
    }
}

/// The window's oldest page, and how many pages it took to reach it.
struct OldestPage {
    page: EventPage,
    heads: Vec<EventHead>,
    pages: u64,
}

/// Page back from now to the window's start, holding only the last page:
/// the oldest (`None`: the window is empty).
async fn oldest_page(
    api: &StripeApi,
    run: &mut RunContext<'_>,
    filter: &KindFilter,
    start: DateTime<Utc>,
) -> Result<Option<OldestPage>, ReconcileError> {
    let mut oldest: Option<OldestPage> = None;
    let mut pages = 0;
    loop {
        run.check_scan_cap("GET /v1/events")?;
        let older_than = oldest.as_ref().and_then(|held| held.heads.last());
        let from = PageFrom::OlderThan(older_than.map(|head| head.id.as_str()));
        let request = list_request(api, filter, from, Some(start.timestamp()));
        let response = run.send(&request).await?;
        let page = page_of(&request, &response)?;
        let heads = heads_of(&request, &page)?;
        check_backward(&request, older_than, &page, &heads)?;
        pages += 1;
        run.scan_page_done();
        let more = page.has_more;
        if !heads.is_empty() {
            oldest = Some(OldestPage { page, heads, pages });
        }
        if !more {
            return Ok(oldest);
        }
    }
}

/// Record one listed event, or count it as not handled; refuse one of
/// another account or mode than the source's before anything is recorded.
async fn take(
    run: &mut RunContext<'_>,
    filter: &KindFilter,
    account: &SourceAccount,
    head: &EventHead,
    event: &serde_json::Value,
) -> Result<(), ReconcileError> {
    account.check(run, event)?;
    if !filter.takes(&head.kind) {
        run.summary.not_handled += 1;
        return Ok(());
    }
    run.record(&head.id, &head.kind, event.clone()).await
}

/// `GET /v1/events` with the run's filters.
fn list_request(
    api: &StripeApi,
    filter: &KindFilter,
    from: PageFrom<'_>,
    created_since: Option<i64>,
) -> ApiRequest {
    let mut url = api.base_url.clone();
    url.set_path(&format!("{}v1/events", trailing_slash(url.path())));
    {
        let mut query = url.query_pairs_mut();
        query.append_pair("limit", &api.page_size.to_string());
        match from {
            PageFrom::NewerThan(id) => {
                query.append_pair("ending_before", id);
            }
            PageFrom::OlderThan(Some(id)) => {
                query.append_pair("starting_after", id);
            }
            PageFrom::OlderThan(None) => {}
        }
        if let Some(since) = created_since {
            query.append_pair("created[gte]", &since.to_string());
        }
        if let Some(kinds) = filter.server_side(MAX_TYPES) {
            for kind in kinds {
                query.append_pair("types[]", kind);
            }
        }
        if api.only_failed {
            query.append_pair("delivery_success", "false");
        }
    }
    ApiRequest::get(url).header(AUTHORIZATION, format!("Bearer {}", api.api_key))
}

/// The page, or Stripe's refusal in words.
fn page_of(request: &ApiRequest, response: &ApiResponse) -> Result<EventPage, ReconcileError> {
    let what = request.what();
    if !response.status.is_success() {
        return Err(response.refused(
            &what,
            "check the API key (a secret or restricted key with read access to events) and the base URL",
        ));
    }
    response.json(&what)
}

/// The id, type and time of each event on a page.
fn heads_of(request: &ApiRequest, page: &EventPage) -> Result<Vec<EventHead>, ReconcileError> {
    page.data
        .iter()
        .map(|event| {
            EventHead::deserialize(event).map_err(|error| ReconcileError::Malformed {
                what: request.what(),
                reason: format!("an event: {error}"),
            })
        })
        .collect()
}

/// Stripe's `resource_missing`: the cursor's event is gone.
fn is_resource_missing(response: &ApiResponse) -> bool {
    serde_json::from_slice::<serde_json::Value>(&response.body)
        .ok()
        .and_then(|body| {
            body.pointer("/error/code")
                .and_then(|code| code.as_str().map(|code| code == "resource_missing"))
        })
        .unwrap_or(false)
}

/// A Stripe `created` (Unix seconds) as a time.
fn created_at(created: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(created, 0)
}
