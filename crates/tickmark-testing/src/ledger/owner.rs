//! Who made a call: the step an `Idempotency-Key` names, read back from the
//! key's `{source}:{event id}:{step}` form.

use std::fmt;

use tickmark_core::handler::MAX_NAME_LEN;

/// Who made a call: the step running when it arrived.
///
/// Read from the call's `Idempotency-Key` when it is a tickmark key
/// ([`EffectOwner::from_key`]); otherwise the test kit says which step was
/// running.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EffectOwner {
    /// The event's source (`stripe`).
    pub source: String,
    /// The event's id (`evt_1`); it may contain `:`.
    pub event_id: String,
    /// The step's name (`send_receipt`).
    pub step: String,
}

impl EffectOwner {
    /// The owner `step` of event `event_id` from `source`.
    pub fn new(
        source: impl Into<String>,
        event_id: impl Into<String>,
        step: impl Into<String>,
    ) -> Self {
        Self {
            source: source.into(),
            event_id: event_id.into(),
            step: step.into(),
        }
    }

    /// The step a tickmark idempotency key names, or `None` when `key` is not
    /// one (a random UUID, say).
    ///
    /// A key is `{source}:{event id}:{step}` ([`tickmark_core::idempotency_key`]).
    /// Source and step names cannot contain `:` (they are letters, digits,
    /// `_`, `-`, `.` and `/`, as [`Handlers::on`](tickmark_core::Handlers::on)
    /// checks), so the source ends at the first `:` and the step starts after
    /// the last one: whatever lies between is the event id, `:`s and all.
    ///
    /// ```
    /// use tickmark::testing::EffectOwner;
    ///
    /// let owner = EffectOwner::from_key("shopify:gid://shopify/Order/1:notify").unwrap();
    /// assert_eq!(owner, EffectOwner::new("shopify", "gid://shopify/Order/1", "notify"));
    /// assert_eq!(EffectOwner::from_key("9b2f4c1e-5d6a-4f7b-8c9d-0e1f2a3b4c5d"), None);
    /// ```
    pub fn from_key(key: &str) -> Option<Self> {
        let (source, rest) = key.split_once(':')?;
        let (event_id, step) = rest.rsplit_once(':')?;
        let valid = is_name(source)
            && is_name(step)
            && !event_id.is_empty()
            && !event_id.chars().any(char::is_control);
        valid.then(|| Self::new(source, event_id, step))
    }

    /// This step's idempotency key: what [`from_key`](Self::from_key) reads.
    pub fn idempotency_key(&self) -> String {
        tickmark_core::idempotency_key(&self.source, &self.event_id, &self.step)
    }
}

impl fmt::Display for EffectOwner {
    /// `step `send_receipt` of event stripe/evt_1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "step `{}` of event {}/{}",
            self.step, self.source, self.event_id
        )
    }
}

/// Whether `name` can be a source or a step name: what `Handlers::on`
/// accepts (`handler::check_name`), less its `*` wildcard, which no event
/// has for a source.
fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_made_by_the_engine_reads_back_as_its_step() {
        let owner = EffectOwner::new("stripe", "evt_1NG8Du2eZvKYlo2C", "send_receipt");
        let key = owner.idempotency_key();
        assert_eq!(key, "stripe:evt_1NG8Du2eZvKYlo2C:send_receipt");
        assert_eq!(EffectOwner::from_key(&key), Some(owner));
    }

    #[test]
    fn an_event_id_with_colons_stays_whole() {
        let owner = EffectOwner::from_key("github:delivery:a:b::c:payments.charge/v2");
        assert_eq!(
            owner,
            Some(EffectOwner::new(
                "github",
                "delivery:a:b::c",
                "payments.charge/v2"
            ))
        );
    }

    #[test]
    fn keys_that_are_not_tickmark_keys_name_no_one() {
        for key in [
            "",
            "9b2f4c1e-5d6a-4f7b-8c9d-0e1f2a3b4c5d",
            "stripe:evt_1",
            ":evt_1:step",
            "stripe::step",
            "stripe:evt_1:",
            "stripe:evt_1:send receipt",
            "str ipe:evt_1:step",
            "stripe:evt\n1:step",
            "*:evt_1:step",
        ] {
            assert_eq!(EffectOwner::from_key(key), None, "{key:?}");
        }
        let long = "s".repeat(MAX_NAME_LEN + 1);
        assert_eq!(EffectOwner::from_key(&format!("{long}:evt_1:step")), None);
        assert!(EffectOwner::from_key(&format!("{}:evt_1:step", &long[1..])).is_some());
    }

    #[test]
    fn an_owner_says_which_step_of_which_event() {
        let owner = EffectOwner::new("stripe", "evt_1", "send_receipt");
        assert_eq!(
            owner.to_string(),
            "step `send_receipt` of event stripe/evt_1"
        );
    }
}
