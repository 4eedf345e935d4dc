//! Webhook secrets as the example apps read them from an environment
//! variable: several, comma-separated, while one is rotated.

/// The secrets in a variable's value: comma-separated, blanks dropped;
/// `None` when there is none.
pub fn secrets(value: Option<String>) -> Option<Vec<String>> {
    let secrets: Vec<String> = value
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    (!secrets.is_empty()).then_some(secrets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_comma_separated() {
        assert_eq!(secrets(None), None);
        assert_eq!(secrets(Some(" , ".into())), None);
        assert_eq!(
            secrets(Some("new, old".into())),
            Some(vec!["new".to_owned(), "old".to_owned()])
        );
    }
}
