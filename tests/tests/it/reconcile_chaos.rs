//! The reconcile chaos run (docs/reconcile.md, "The chaos run"): the
//! receiver is down (answering 503) for 4 simulated days while Stripe and
//! GitHub keep sending, as their loopback fakes do by their documented
//! schedules (Stripe retries for 3 days, GitHub never); then it comes back,
//! and live retries, reconcile runs (one stopped mid-run, two at once) and
//! workers interleave in an order drawn from a seed (printed; set
//! `TICKMARK_CHAOS_SEED` to replay one).
//!
//! Two outages:
//! - the receiver alone is down: the worker and its scheduled reconciler
//!   run every 6 simulated hours, pulling Stripe's events and fetching
//!   GitHub's payloads, and Stripe's retries meet the pulled copies when the
//!   receiver is back. Nothing is lost.
//! - the whole service is down for the 4 days: Stripe's events are pulled
//!   from the cursor when it is back, 30 days being far more than 4, and
//!   nothing of Stripe's is lost; GitHub's deliveries older than its 3 days
//!   of log are gone, as GitHub documents, and exactly those are lost.
//!
//! Every event a handler takes runs exactly once.

use std::collections::HashSet;
use std::time::Duration;

use crate::reconcile_support::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tickmark::reconcile::{
    GitHubApi, GitHubHook, GitHubRecovery, NoProgress, Progress, ReconcileError, ReconcileSummary,
    Reconciler, RunRequest, StripeApi,
};
use tickmark::Backend;
use tickmark_tests::github_api::{FakeGitHub, HookRef, RETENTION};
use tickmark_tests::stripe_api::FakeStripe;
use tickmark_tests::TestDb;
use tokio_util::sync::CancellationToken;

const HOUR: Duration = Duration::from_secs(3600);
const OUTAGE_HOURS: u64 = 4 * 24;

/// The seed: `TICKMARK_CHAOS_SEED`, or a fresh one, printed either way.
fn seed() -> u64 {
    let seed = std::env::var("TICKMARK_CHAOS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random);
    println!("reconcile chaos seed: {seed} (TICKMARK_CHAOS_SEED={seed} replays it)");
    seed
}

/// What a run sent, to check at the end.
#[derive(Default)]
struct Sent {
    /// Stripe events of the handled kind.
    stripe: Vec<String>,
    /// GitHub GUIDs of the handled kind, with their delivery time (fake clock).
    github: Vec<(String, i64)>,
}

struct World {
    db: TestDb,
    engine: tickmark::Engine,
    receiver: SwitchedReceiver,
    stripe: FakeStripe,
    github: FakeGitHub,
    hook: HookRef,
    reconciler: Reconciler,
    rng: StdRng,
    sent: Sent,
}

impl World {
    async fn new(seed: u64, lease: Duration) -> Option<World> {
        let (db, engine) = test_engine(Backend::Postgres).await?;
        let receiver = SwitchedReceiver::start(&engine).await;
        let stripe = FakeStripe::start().await;
        stripe.add_endpoint(&receiver.url("stripe"), STRIPE_SECRET, &["*"]);
        let github = FakeGitHub::start().await;
        let hook_id = github.add_repo_hook("acme", "shop", &receiver.url("github"), GITHUB_SECRET);
        let start = chrono::Utc::now().timestamp() - i64::try_from(OUTAGE_HOURS * 3600).unwrap();
        stripe.set_now(start);
        github.set_now(start);
        let clock_fake = stripe.clone();
        let reconciler = reconciler(&engine, &format!("chaos-{seed}"))
            .with_lease(lease)
            .with_clock(clock_of(move || clock_fake.now()))
            .stripe(
                "stripe",
                StripeApi::new(stripe.api_key())
                    .with_base_url(&stripe.base_url())
                    .expect("url")
                    .with_page_size(10),
            )
            .github(
                "github",
                GitHubApi::new(
                    github.token(),
                    GitHubHook::Repository {
                        owner: "acme".into(),
                        repo: "shop".into(),
                        hook_id,
                    },
                )
                .with_base_url(&github.base_url())
                .expect("url")
                .with_recovery(GitHubRecovery::FetchPayload)
                .with_page_size(10),
            );
        Some(World {
            db,
            engine,
            receiver,
            stripe,
            github,
            hook: HookRef::repo("acme", "shop", hook_id),
            reconciler,
            rng: StdRng::seed_from_u64(seed),
            sent: Sent::default(),
        })
    }

    /// One simulated hour: the clocks move, each provider sends 0–3 events
    /// (a third of them of a kind no handler takes), Stripe retries what is due.
    async fn hour(&mut self) {
        self.stripe.advance(HOUR);
        self.github.advance(HOUR);
        for _ in 0..self.rng.gen_range(0..=3) {
            if self.rng.gen_bool(1.0 / 3.0) {
                self.stripe
                    .create_event("customer.updated", json!({ "id": "cus_1" }));
            } else {
                let n = self.sent.stripe.len();
                let id = self.stripe.create_event(
                    STRIPE_KIND,
                    json!({ "id": format!("in_{n}"), "amount_paid": n }),
                );
                self.sent.stripe.push(id);
            }
        }
        for _ in 0..self.rng.gen_range(0..=3) {
            if self.rng.gen_bool(1.0 / 3.0) {
                self.github
                    .send(self.hook.clone(), "push", json!({ "ref": "main" }))
                    .await;
            } else {
                let n = self.sent.github.len();
                let sent = self
                    .github
                    .send(
                        self.hook.clone(),
                        GITHUB_KIND,
                        json!({ "action": "opened", "n": n }),
                    )
                    .await;
                self.sent.github.push((sent.guid, self.github.now()));
            }
        }
        self.stripe.deliver_due().await;
    }

    /// Reconcile both sources once; a busy source (another run holds it) is fine.
    async fn reconcile(&self, progress: &dyn Progress, cancel: &CancellationToken) {
        for source in ["stripe", "github"] {
            match self
                .reconciler
                .run(source, &RunRequest::default(), progress, cancel)
                .await
            {
                Ok(_) | Err(ReconcileError::Busy { .. } | ReconcileError::Cancelled) => {}
                Err(error) => panic!("{source}: {error}"),
            }
        }
    }

    /// After the outage: live retries, reconcile runs (one stopped after its
    /// first page, two at once) and workers, in an order drawn from the seed.
    async fn recover(&mut self) {
        self.receiver.set_down(false);
        // A process that starts runs its scheduled reconciler at once.
        self.reconcile(&NoProgress, &CancellationToken::new()).await;
        let mut actions: Vec<u8> = vec![0, 0, 0, 1, 1, 2, 3, 4];
        for i in (1..actions.len()).rev() {
            let j = self.rng.gen_range(0..=i);
            actions.swap(i, j);
        }
        for action in actions {
            match action {
                // Stripe's retries that are due now.
                0 => {
                    self.stripe.advance(HOUR);
                    self.github.advance(HOUR);
                    self.stripe.deliver_due().await;
                }
                1 => self.reconcile(&NoProgress, &CancellationToken::new()).await,
                // A run stopped (shutdown) after its first page.
                2 => {
                    let cancel = CancellationToken::new();
                    self.reconcile(&CancelAfterFirstPage(cancel.clone()), &cancel)
                        .await;
                }
                // Two processes at once: one of them is refused.
                3 => {
                    let other = self.reconciler.clone().with_owner("chaos-other");
                    let cancel = CancellationToken::new();
                    let request = RunRequest::default();
                    let (a, b) = tokio::join!(
                        self.reconciler
                            .run("stripe", &request, &NoProgress, &cancel),
                        other.run("stripe", &request, &NoProgress, &cancel),
                    );
                    for result in [a, b] {
                        assert!(
                            matches!(result, Ok(_) | Err(ReconcileError::Busy { .. })),
                            "{result:?}"
                        );
                    }
                }
                _ => drain(&self.engine).await,
            }
        }
        // Then until the providers have nothing left to send: every Stripe
        // retry delivered or given up, a last run, the workers.
        for _ in 0..6 {
            self.stripe.advance(12 * HOUR);
            self.github.advance(12 * HOUR);
            self.stripe.deliver_due().await;
        }
        self.reconcile(&NoProgress, &CancellationToken::new()).await;
        drain(&self.engine).await;
    }

    /// Each handled event ran once: Stripe's, and GitHub's within its log
    /// (those older than `lost_github_allowed_before` never ran). Returns
    /// the Stripe events, the GitHub ones that ran and those lost.
    async fn check(&self, lost_github_allowed_before: Option<i64>) -> (usize, usize, usize) {
        let mut given_up = 0;
        for id in &self.sent.stripe {
            assert_eq!(runs(&self.db, id).await, 1, "stripe event {id} ran once");
            given_up += usize::from(self.stripe.delivery_state(id).is_some_and(|d| d.given_up));
        }
        println!(
            "  of the Stripe events, Stripe gave up on {given_up}: only a pull brought them in"
        );
        if lost_github_allowed_before.is_some() {
            assert!(
                given_up > 0,
                "some events were past Stripe's 3 days of retries"
            );
        }
        let (mut kept, mut lost) = (0, 0);
        for (guid, at) in &self.sent.github {
            let ran = runs(&self.db, guid).await;
            match lost_github_allowed_before {
                // The fake lists deliveries strictly newer than 3 days.
                Some(horizon) if *at <= horizon => {
                    assert_eq!(ran, 0, "{guid}: past GitHub's log, unrecoverable");
                    lost += 1;
                }
                _ => {
                    assert_eq!(ran, 1, "github delivery {guid} at {at} (horizon {lost_github_allowed_before:?}, now {}) ran once", self.github.now());
                    kept += 1;
                }
            }
        }
        let distinct: HashSet<_> = self.sent.stripe.iter().collect();
        assert_eq!(distinct.len(), self.sent.stripe.len());
        (self.sent.stripe.len(), kept, lost)
    }
}

/// Stops the run (as a shutdown does) once its first page is handled.
struct CancelAfterFirstPage(CancellationToken);

impl Progress for CancelAfterFirstPage {
    fn page(&self, pages: u64, _summary: &ReconcileSummary) {
        if pages == 1 {
            self.0.cancel();
        }
    }
}

/// The receiver alone is down for 4 days; the worker's reconciler runs
/// every 6 simulated hours. Nothing is lost; everything runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_down_four_days_with_the_reconciler_running_loses_nothing() {
    let seed = seed();
    let Some(mut world) = World::new(seed, Duration::from_secs(30)).await else {
        return;
    };
    world
        .reconcile(&NoProgress, &CancellationToken::new())
        .await;
    world.receiver.set_down(true);
    for hour in 1..=OUTAGE_HOURS {
        world.hour().await;
        if hour % 6 == 0 {
            world
                .reconcile(&NoProgress, &CancellationToken::new())
                .await;
        }
    }
    world.recover().await;
    let (stripe, github, lost) = world.check(None).await;
    println!("reconcile chaos (seed {seed}), reconciler running: {stripe} Stripe and {github} GitHub events, each ran once; {lost} lost");
    assert!(
        stripe > 50 && github > 50,
        "the run sent enough to mean something"
    );
}

/// The whole service is down for 4 days (the reconciler too, with its
/// cursor from before). Stripe's events all come back, from the cursor;
/// GitHub's deliveries older than its 3-day log are lost, and only those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_down_four_days_recovers_every_stripe_event_and_githubs_last_three_days() {
    let seed = seed();
    let Some(mut world) = World::new(seed, Duration::from_secs(30)).await else {
        return;
    };
    // The reconciler ran before the outage: its cursors are set.
    world
        .stripe
        .create_event(STRIPE_KIND, json!({ "id": "in_before" }));
    world
        .reconcile(&NoProgress, &CancellationToken::new())
        .await;
    world.receiver.set_down(true);
    for _ in 0..OUTAGE_HOURS {
        world.hour().await;
    }
    // What GitHub still lists when the service is back and reconciles.
    let horizon = world.github.now() - i64::try_from(RETENTION.as_secs()).unwrap();
    world.recover().await;
    let (stripe, github, lost) = world.check(Some(horizon)).await;
    println!("reconcile chaos (seed {seed}), service down: {stripe} Stripe events each ran once; GitHub: {github} within its 3-day log ran once, {lost} older were lost as GitHub documents");
    assert!(
        stripe > 50 && github > 30 && lost > 0,
        "the run sent enough to mean something"
    );
}
