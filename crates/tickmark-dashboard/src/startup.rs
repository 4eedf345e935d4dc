//! What the dashboard warns about at start-up: a configuration that works
//! but leaves a door open. Warnings never show the token.

use std::fmt;

/// The shortest token that draws no warning, in bytes: 128 bits, as for the
/// receiver's signing secrets. `openssl rand -hex 24` gives 48 characters.
pub const MIN_TOKEN_BYTES: usize = 16;

/// Something in the dashboard's configuration an operator should fix.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupWarning {
    /// The token is shorter than [`MIN_TOKEN_BYTES`]: the throttle slows
    /// guessing down but a short token still falls to a patient guesser.
    ShortToken {
        /// Its length, in bytes.
        bytes: usize,
    },
}

impl fmt::Display for StartupWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartupWarning::ShortToken { bytes } => write!(
                f,
                "the dashboard token is only {bytes} bytes long; use at least {MIN_TOKEN_BYTES} \
                 random bytes (`openssl rand -hex 24`), or it can be guessed"
            ),
        }
    }
}

/// The warnings for a token `token_bytes` long (none without a token).
pub(crate) fn warnings(token_bytes: Option<usize>) -> Vec<StartupWarning> {
    token_bytes
        .filter(|bytes| *bytes < MIN_TOKEN_BYTES)
        .map(|bytes| StartupWarning::ShortToken { bytes })
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_under_128_bits_is_warned_about() {
        assert_eq!(
            warnings(Some(MIN_TOKEN_BYTES - 1)),
            [StartupWarning::ShortToken { bytes: 15 }]
        );
        assert!(warnings(Some(MIN_TOKEN_BYTES)).is_empty());
        assert!(warnings(None).is_empty(), "no token: nothing to guess");
        let text = warnings(Some(3))[0].to_string();
        assert!(text.contains("3 bytes") && text.contains("16"), "{text}");
    }
}
