//! A credential held as text (an API key, a token) that never prints.
//!
//! Command-line and configuration structs derive `Debug`, and a `{:?}` of
//! one ends up in a log or a panic message sooner or later. A field of type
//! [`SecretString`] shows `***` there, whatever else the struct gains;
//! the program reads the text with [`SecretString::expose`], where it is
//! sent.

use std::convert::Infallible;
use std::str::FromStr;

/// Text that must not be printed: its `Debug` and `Display` show `***`.
/// `FromStr`, so clap takes it as an argument's type (`Option<SecretString>`
/// with `env = "STRIPE_API_KEY"`).
///
/// ```
/// use tickmark::SecretString;
/// let key: SecretString = "sk_live_123".parse().unwrap();
/// assert_eq!(format!("{key:?} {key}"), "*** ***");
/// assert_eq!(key.expose(), "sk_live_123");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(String);

impl SecretString {
    /// Hold `text` as a secret.
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The text itself, for where it is sent (a header, a client).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the text is empty (an unset environment variable given as `""`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for SecretString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl std::fmt::Display for SecretString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl FromStr for SecretString {
    type Err = Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Self::new(text))
    }
}

impl From<String> for SecretString {
    fn from(text: String) -> Self {
        Self(text)
    }
}
