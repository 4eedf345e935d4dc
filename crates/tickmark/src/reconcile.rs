//! Recovering what a provider gave up on, from its own API: Stripe's events,
//! GitHub's delivery log, Shopify's webhook subscriptions (the
//! `tickmark-reconcile` crate). A [`Reconciler`] runs a [`RunRequest`] for a
//! source within [`RunLimits`]; the guide is docs/reconcile.md.

pub use tickmark_reconcile::{
    ClientSettings, GitHubApi, GitHubHook, GitHubRecovery, LogProgress, MissingSubscription,
    NoProgress, Progress, ReconcileError, ReconcileSummary, Reconciler, RunLimits, RunRequest,
    ShopifyApi, StripeApi,
};
