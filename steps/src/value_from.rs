//! Where a step takes a JSON value from: a fixed value, the event payload, an
//! earlier step's output, or a text template.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tickmark::{StepContext, StepError};

/// Where a step takes a JSON value from (a request body, a file's content, a
/// webhook payload). Stored in the plan as `{"from": "…", …}`.
///
/// A pointer is a JSON pointer (RFC 6901): empty for the whole value,
/// otherwise `/`-separated (`/data/object/id`). Anything that cannot be
/// resolved — a pointer that finds nothing, a step that has no output — is a
/// terminal error: retrying would find the same stored values. The steps of
/// this crate declare the earlier step an `Output` names in
/// [`Step::reads`](tickmark::Step::reads), so a name that is not an earlier
/// step of the handler is refused by `Engine::new`.
///
/// ```
/// use tickmark_steps::ValueFrom;
///
/// let from = ValueFrom::output("charge", "/receipt/id");
/// assert_eq!(
///     serde_json::to_value(&from).unwrap(),
///     serde_json::json!({"from": "output", "step": "charge", "pointer": "/receipt/id"})
/// );
/// let template: ValueFrom =
///     serde_json::from_str(r#"{"from": "template", "template": "{source}/{event_id}"}"#).unwrap();
/// assert_eq!(template, ValueFrom::template("{source}/{event_id}"));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum ValueFrom {
    /// A fixed value, written into the plan.
    Fixed {
        /// The value.
        value: Value,
    },
    /// The event's payload, whole or at `pointer`.
    Event {
        /// A JSON pointer into the payload; empty for all of it.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        pointer: String,
    },
    /// The stored output of an earlier step of the same handler.
    Output {
        /// The earlier step's name in the handler.
        step: String,
        /// A JSON pointer into its output; empty for all of it.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        pointer: String,
    },
    /// A string made from a template: `{event_id}`, `{source}`, `{kind}`,
    /// `{idempotency_key}` and `{received_at}` (RFC 3339) are replaced,
    /// `{{` and `}}` are literal braces; any other `{…}` is a terminal error.
    Template {
        /// The template text.
        template: String,
    },
}

impl ValueFrom {
    /// A fixed value.
    pub fn fixed(value: Value) -> Self {
        ValueFrom::Fixed { value }
    }

    /// The whole event payload.
    pub fn event() -> Self {
        ValueFrom::Event {
            pointer: String::new(),
        }
    }

    /// The part of the event payload at JSON pointer `pointer`.
    pub fn event_at(pointer: impl Into<String>) -> Self {
        ValueFrom::Event {
            pointer: pointer.into(),
        }
    }

    /// The part of earlier step `step`'s output at JSON pointer `pointer`
    /// (`""` for all of it).
    pub fn output(step: impl Into<String>, pointer: impl Into<String>) -> Self {
        ValueFrom::Output {
            step: step.into(),
            pointer: pointer.into(),
        }
    }

    /// A string rendered from `template`.
    pub fn template(template: impl Into<String>) -> Self {
        ValueFrom::Template {
            template: template.into(),
        }
    }

    /// The earlier step whose output this value is taken from, if it is one:
    /// what a step using it declares in
    /// [`Step::reads`](tickmark::Step::reads), so that `Engine::new` refuses
    /// a handler in which no step before it has that name.
    pub fn reads_step(&self) -> Option<&str> {
        match self {
            ValueFrom::Output { step, .. } => Some(step),
            _ => None,
        }
    }

    /// The value, for the event and earlier outputs `ctx` holds.
    pub fn resolve<'v>(&'v self, ctx: &'v StepContext<'_>) -> Result<Cow<'v, Value>, StepError> {
        match self {
            ValueFrom::Fixed { value } => Ok(Cow::Borrowed(value)),
            ValueFrom::Event { pointer } => {
                at_pointer(&ctx.event().payload, pointer, "the event payload").map(Cow::Borrowed)
            }
            ValueFrom::Output { step, pointer } => {
                let output = ctx.output(step).ok_or_else(|| {
                    StepError::terminal(format!(
                        "step `{step}` has no stored output for this event; \
                         name an earlier step of the same handler"
                    ))
                })?;
                at_pointer(output, pointer, &format!("the output of step `{step}`"))
                    .map(Cow::Borrowed)
            }
            ValueFrom::Template { template } => {
                render_template(template, ctx).map(|text| Cow::Owned(Value::String(text)))
            }
        }
    }
}

/// `value` at JSON pointer `pointer`, or a terminal error naming `what`.
fn at_pointer<'v>(value: &'v Value, pointer: &str, what: &str) -> Result<&'v Value, StepError> {
    if !pointer.is_empty() && !pointer.starts_with('/') {
        return Err(StepError::terminal(format!(
            "`{pointer}` is not a JSON pointer: it must be empty or start with `/`"
        )));
    }
    value.pointer(pointer).ok_or_else(|| {
        StepError::terminal(format!("{what} has nothing at JSON pointer `{pointer}`"))
    })
}

/// Render `template` for the event of `ctx`.
pub(crate) fn render_template(template: &str, ctx: &StepContext<'_>) -> Result<String, StepError> {
    let event = ctx.event();
    render(template, |name| match name {
        "event_id" => Some(event.id.clone()),
        "source" => Some(event.source.clone()),
        "kind" => Some(event.kind.clone()),
        "idempotency_key" => Some(ctx.idempotency_key().to_owned()),
        "received_at" => Some(event.received_at.to_rfc3339()),
        _ => None,
    })
}

/// Replace `{name}` with `lookup(name)`; `{{` and `}}` are literal braces.
fn render(template: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, StepError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find(['{', '}']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("{{") {
            out.push('{');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("}}") {
            out.push('}');
            rest = after;
        } else if let Some(after) = tail.strip_prefix('{') {
            let end = after.find('}').ok_or_else(|| {
                StepError::terminal(format!(
                    "template `{template}` has an unclosed `{{` (write `{{{{` for a literal brace)"
                ))
            })?;
            let name = &after[..end];
            let value = lookup(name).ok_or_else(|| {
                StepError::terminal(format!(
                    "template `{template}` names `{{{name}}}`; known: {{event_id}}, {{source}}, \
                     {{kind}}, {{idempotency_key}}, {{received_at}}"
                ))
            })?;
            out.push_str(&value);
            rest = &after[end + 1..];
        } else {
            return Err(StepError::terminal(format!(
                "template `{template}` has a lone `}}` (write `}}}}` for a literal brace)"
            )));
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tickmark::{Resources, StepOutputs};

    use super::*;
    use crate::test_support::{context, event};

    fn lookup(name: &str) -> Option<String> {
        match name {
            "event_id" => Some("evt_1".into()),
            "kind" => Some("order.paid".into()),
            _ => None,
        }
    }

    #[test]
    fn templates_replace_known_names_and_keep_doubled_braces() {
        assert_eq!(
            render("{kind} of {event_id}", lookup).unwrap(),
            "order.paid of evt_1"
        );
        assert_eq!(
            render("{{\"id\": \"{event_id}\"}}", lookup).unwrap(),
            "{\"id\": \"evt_1\"}"
        );
        assert_eq!(render("plain", lookup).unwrap(), "plain");
        assert_eq!(render("", lookup).unwrap(), "");
        assert_eq!(render("é{event_id}ü", lookup).unwrap(), "éevt_1ü");
    }

    #[test]
    fn bad_templates_are_terminal() {
        for bad in ["{nope}", "{event_id", "a } b", "{}"] {
            let error = render(bad, lookup).unwrap_err();
            assert!(error.is_terminal(), "{bad}: {error}");
        }
    }

    #[test]
    fn values_resolve_from_event_output_fixed_and_template() {
        let event = event("evt_1", json!({"order": {"id": "o_1", "lines": [1, 2]}}));
        // StepOutputs has no public constructor with entries: resolving from
        // a real earlier output is covered by tests/tests/it/steps.rs.
        let outputs = StepOutputs::default();
        let resources = Resources::default();
        let ctx = context(&event, "this", &outputs, &resources);
        let get = |from: ValueFrom| from.resolve(&ctx).map(Cow::into_owned);
        assert_eq!(get(ValueFrom::event()).unwrap(), event.payload);
        assert_eq!(
            get(ValueFrom::event_at("/order/lines/1")).unwrap(),
            json!(2)
        );
        assert_eq!(get(ValueFrom::fixed(json!([1]))).unwrap(), json!([1]));
        assert_eq!(
            get(ValueFrom::template("{source}/{kind}/{idempotency_key}")).unwrap(),
            json!("shop/order.paid/shop:evt_1:this")
        );
        for missing in [
            ValueFrom::event_at("/order/nope"),
            ValueFrom::event_at("order"),
            ValueFrom::output("charge", ""),
        ] {
            assert!(
                get(missing.clone()).unwrap_err().is_terminal(),
                "{missing:?}"
            );
        }
    }

    #[test]
    fn pointers_into_an_output() {
        let output = json!({"receipt": {"id": "r_9"}, "lines": ["a"]});
        assert_eq!(at_pointer(&output, "", "x").unwrap(), &output);
        assert_eq!(at_pointer(&output, "/receipt/id", "x").unwrap(), "r_9");
        assert_eq!(at_pointer(&output, "/lines/0", "x").unwrap(), "a");
        let error =
            at_pointer(&output, "/receipt/nope", "the output of step `charge`").unwrap_err();
        assert!(error.is_terminal());
        assert!(error.message().contains("step `charge`"), "{error}");
        assert!(at_pointer(&output, "receipt", "x")
            .unwrap_err()
            .is_terminal());
    }

    #[test]
    fn the_stored_form_is_tagged_by_from() {
        for (from, stored) in [
            (ValueFrom::event(), json!({"from": "event"})),
            (
                ValueFrom::event_at("/a"),
                json!({"from": "event", "pointer": "/a"}),
            ),
            (
                ValueFrom::output("s", ""),
                json!({"from": "output", "step": "s"}),
            ),
            (
                ValueFrom::fixed(json!({"k": 1})),
                json!({"from": "fixed", "value": {"k": 1}}),
            ),
        ] {
            assert_eq!(serde_json::to_value(&from).unwrap(), stored);
            assert_eq!(serde_json::from_value::<ValueFrom>(stored).unwrap(), from);
        }
    }
}
