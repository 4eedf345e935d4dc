//! Browser sessions without a session table.
//!
//! Signing in through the login form sets one cookie whose value is an
//! expiry time and an HMAC-SHA256 of it and of the current *generation*
//! under a key drawn from the operating system's random source when the
//! token was configured. Checking a cookie is recomputing the HMAC and
//! comparing in constant time (`subtle`): no session table, nothing to clean
//! up. The generation is one counter in memory: signing out
//! ([`Sessions::revoke_all`]) moves it on, which invalidates every session
//! issued before, in every browser: a stolen cookie replayed after its
//! owner signed out is refused. (Revoking one session alone would need a
//! table of revoked sessions; for an operator dashboard signing everyone out
//! is acceptable, and they sign in again.) The key lives only in this
//! process's memory, so a restart signs every browser out, and processes do
//! not accept each other's cookies (route the dashboard to one process, or
//! use the bearer token).
//!
//! Each session has its CSRF token: an HMAC of the cookie's value under the
//! same key, for another purpose. Every state-changing form carries it in a
//! hidden field; a forged cross-site form cannot read it.
//!
//! The cookie is `HttpOnly` (no script reads it), `SameSite=Strict` (no
//! other site's form or link sends it) and always `Secure`: it then never
//! travels over plain HTTP to another machine. Browsers treat `localhost`
//! and `127.0.0.1` as secure, so a dashboard reached over loopback or an SSH
//! tunnel works over `http://`; anywhere else serve it over HTTPS (a
//! TLS-terminating proxy is enough: the browser sees HTTPS, which is what
//! counts, and the server cannot reliably tell that it is behind one, which
//! is why the attribute does not depend on the request).
//!
//! The `Cookie` header is read and the `Set-Cookie` header written by hand:
//! one name, one fixed format, a few lines, where the `cookie` crate would
//! bring the `time` crate along.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{header, HeaderMap, HeaderValue};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The session cookie's name.
pub const COOKIE: &str = "tickmark_session";

/// How long a session lasts after signing in.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// The per-process key that signs sessions and CSRF tokens, and the
/// generation of the sessions it accepts.
pub struct Sessions {
    key: [u8; 32],
    generation: AtomicU64,
}

impl Sessions {
    /// A fresh random key.
    pub fn new() -> Self {
        let mut key = [0; 32];
        rand::rngs::OsRng.fill_bytes(&mut key);
        Self {
            key,
            generation: AtomicU64::new(0),
        }
    }

    /// A new session's cookie value, valid for [`LIFETIME`] from `now`
    /// (seconds since the Unix epoch) or until [`revoke_all`](Self::revoke_all):
    /// `<expiry>.<hex HMAC>`. The generation is in the HMAC, not in the
    /// cookie.
    pub fn issue(&self, now: u64) -> String {
        let expiry = now.saturating_add(LIFETIME.as_secs());
        format!(
            "{expiry}.{}",
            hex::encode(self.session_tag(&expiry.to_string()))
        )
    }

    /// Invalidate every session issued so far (signing out signs every
    /// browser out).
    pub fn revoke_all(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The tag of a session expiring at `expiry` in the current generation.
    fn session_tag(&self, expiry: &str) -> [u8; 32] {
        let generation = self.generation.load(Ordering::SeqCst);
        self.tag("session", &format!("{expiry}/{generation}"))
    }

    /// Whether `value` is a cookie this key issued that has not expired.
    pub fn is_valid(&self, value: &str, now: u64) -> bool {
        let Some((expiry, tag)) = value.split_once('.') else {
            return false;
        };
        let (Ok(expiry_at), Ok(tag)) = (expiry.parse::<u64>(), hex::decode(tag)) else {
            return false;
        };
        let expected = self.session_tag(expiry);
        bool::from(expected.as_slice().ct_eq(&tag)) && now < expiry_at
    }

    /// The CSRF token of the session whose cookie is `session`.
    pub fn csrf(&self, session: &str) -> String {
        hex::encode(self.tag("csrf", session))
    }

    /// Whether `candidate` is the CSRF token of `session` (constant time).
    pub fn csrf_matches(&self, session: &str, candidate: &str) -> bool {
        let expected = self.csrf(session);
        // Both are hex of a 32-byte tag when right: compare as bytes.
        bool::from(expected.as_bytes().ct_eq(candidate.as_bytes()))
    }

    /// HMAC-SHA256 over `purpose`, a separator and `message`: the purpose
    /// keeps a session tag from ever serving as a CSRF token and back.
    fn tag(&self, purpose: &str, message: &str) -> [u8; 32] {
        // A 32-byte key is a valid HMAC key; `new_from_slice` cannot fail here.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.key) else {
            return [0; 32];
        };
        mac.update(purpose.as_bytes());
        mac.update(b"\0");
        mac.update(message.as_bytes());
        mac.finalize().into_bytes().into()
    }
}

impl Default for Sessions {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Sessions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Sessions(***)")
    }
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_secs())
        .unwrap_or(0)
}

/// The values of every session cookie the request carries (a browser may
/// send several of the same name, set for different paths).
pub fn cookies(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim())
}

/// `Set-Cookie` for a new session, scoped to the dashboard's `path`.
pub fn set_cookie(value: &str, path: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; Path={path}; Max-Age={}; HttpOnly; Secure; SameSite=Strict",
        LIFETIME.as_secs()
    ))
    .ok()
}

/// `Set-Cookie` that removes the session cookie at `path`.
pub fn clear_cookie(path: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!(
        "{COOKIE}=; Path={path}; Max-Age=0; HttpOnly; Secure; SameSite=Strict"
    ))
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    #[test]
    fn an_issued_session_is_valid_until_it_expires() {
        let sessions = Sessions::new();
        let cookie = sessions.issue(NOW);
        assert!(sessions.is_valid(&cookie, NOW));
        assert!(sessions.is_valid(&cookie, NOW + LIFETIME.as_secs() - 1));
        assert!(!sessions.is_valid(&cookie, NOW + LIFETIME.as_secs()));
    }

    #[test]
    fn revoking_invalidates_every_session_issued_before() {
        let sessions = Sessions::new();
        let one = sessions.issue(NOW);
        let two = sessions.issue(NOW + 5);
        sessions.revoke_all();
        assert!(!sessions.is_valid(&one, NOW + 10));
        assert!(!sessions.is_valid(&two, NOW + 10));
        let three = sessions.issue(NOW + 10);
        assert!(sessions.is_valid(&three, NOW + 10));
        sessions.revoke_all();
        assert!(!sessions.is_valid(&three, NOW + 10));
    }

    #[test]
    fn forged_tampered_or_foreign_sessions_are_refused() {
        let sessions = Sessions::new();
        let cookie = sessions.issue(NOW);
        let (expiry, tag) = cookie.split_once('.').unwrap();
        let later = format!("{}.{tag}", expiry.parse::<u64>().unwrap() + 3600);
        let other_process = Sessions::new().issue(NOW);
        let csrf_as_session = format!("{expiry}.{}", sessions.csrf(expiry));
        for forged in [
            "",
            ".",
            "123",
            "abc.def",
            &format!("{expiry}."),
            &later,
            &other_process,
            &csrf_as_session,
            &format!("{cookie}00"),
        ] {
            assert!(!sessions.is_valid(forged, NOW), "{forged:?}");
        }
    }

    #[test]
    fn csrf_tokens_belong_to_their_session() {
        let sessions = Sessions::new();
        let one = sessions.issue(NOW);
        let two = sessions.issue(NOW + 1);
        let token = sessions.csrf(&one);
        assert!(sessions.csrf_matches(&one, &token));
        assert!(!sessions.csrf_matches(&two, &token));
        assert!(!sessions.csrf_matches(&one, ""));
        assert!(!sessions.csrf_matches(&one, &token[1..]));
    }

    #[test]
    fn cookies_are_found_by_name_among_others() {
        let mut headers = HeaderMap::new();
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; tickmark_session=x.y ;b=2"),
        );
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("tickmark_session=z.w"),
        );
        assert_eq!(cookies(&headers).collect::<Vec<_>>(), ["x.y", "z.w"]);
        let set = set_cookie("v.t", "/ops").unwrap();
        let set = set.to_str().unwrap();
        for attribute in [
            "Path=/ops",
            "HttpOnly",
            "Secure",
            "SameSite=Strict",
            "Max-Age=43200",
        ] {
            assert!(set.contains(attribute), "{set}");
        }
    }
}
