//! Which kinds of a source a run takes: the handlers' (or the caller's),
//! sent to the provider as a filter where its API has one, and checked on
//! each listed object either way.

use super::run_context::RunContext;

/// Which kinds a run takes: the server-side filter it may send, and the
/// check each listed object passes.
#[derive(Debug, Clone)]
pub(crate) struct KindFilter {
    /// `None`: every kind.
    kinds: Option<Vec<String>>,
}

impl KindFilter {
    /// The kinds the request names, else the ones the handlers take for the
    /// source (every kind when a handler takes `*`).
    pub fn of(run: &RunContext<'_>) -> Self {
        if let Some(kinds) = &run.request.kinds {
            return Self {
                kinds: (!kinds.is_empty()).then(|| kinds.clone()),
            };
        }
        let registry = run.engine.registry();
        if registry.takes_every_kind(run.source) {
            return Self { kinds: None };
        }
        let kinds = registry
            .named_kinds(run.source)
            .into_iter()
            .map(str::to_owned)
            .collect();
        Self { kinds: Some(kinds) }
    }

    /// The kinds to ask the provider for, when it can filter by at most
    /// `most` of them (`None`: ask for every kind and check each here).
    pub fn server_side(&self, most: usize) -> Option<&[String]> {
        self.kinds
            .as_deref()
            .filter(|kinds| !kinds.is_empty() && kinds.len() <= most)
    }

    /// Whether no kind at all is taken: nothing to reconcile.
    pub fn takes_nothing(&self) -> bool {
        self.kinds.as_ref().is_some_and(Vec::is_empty)
    }

    /// Whether an object of `kind` is taken.
    pub fn takes(&self, kind: &str) -> bool {
        self.kinds
            .as_ref()
            .is_none_or(|kinds| kinds.iter().any(|taken| taken == kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(kinds: Option<&[&str]>) -> KindFilter {
        KindFilter {
            kinds: kinds.map(|kinds| kinds.iter().map(|kind| (*kind).to_owned()).collect()),
        }
    }

    #[test]
    fn a_filter_is_sent_only_when_the_provider_can_hold_it() {
        let two = of(Some(&["invoice.paid", "charge.refunded"]));
        assert_eq!(two.server_side(20).map(<[String]>::len), Some(2));
        assert_eq!(
            two.server_side(1),
            None,
            "more than the API filters on: list all"
        );
        assert!(two.takes("invoice.paid") && !two.takes("customer.created"));
        let every = of(None);
        assert_eq!(every.server_side(20), None);
        assert!(every.takes("anything") && !every.takes_nothing());
        let none = of(Some(&[]));
        assert!(none.takes_nothing() && none.server_side(20).is_none());
    }
}
