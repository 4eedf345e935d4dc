//! Who is guessing: the client address that failed token checks are counted
//! against.
//!
//! The address is the TCP peer, from `axum::extract::ConnectInfo`: tickmark's
//! own server puts it in every request's extensions, and so does
//! `axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())`.
//! Served without it, a request has no client address and only the global
//! budget applies. `X-Forwarded-For` is not read: any client can write it.
//! Behind a reverse proxy every request comes from the proxy, so the
//! per-address budget becomes a second global one.
//!
//! An IPv6 client is its /64: one host (or one customer of a provider) is
//! usually given a whole /64, and could otherwise take a fresh address for
//! every guess. An IPv4-mapped IPv6 address (`::ffff:192.0.2.1`, what a
//! dual-stack socket reports for an IPv4 peer) is that IPv4 address.

use std::convert::Infallible;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::Extensions;

/// A client address as the throttle counts it: an IPv4 address, or an IPv6
/// /64 prefix (the rest of the address zeroed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Client(IpAddr);

impl Client {
    /// The client `ip` belongs to.
    pub(crate) fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Client(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Client(IpAddr::V4(v4)),
                None => {
                    let prefix = u128::from(v6) & (u128::MAX << 64);
                    Client(IpAddr::V6(Ipv6Addr::from(prefix)))
                }
            },
        }
    }

    /// The client of the request whose extensions are `extensions`, when the
    /// server recorded the peer's address.
    pub(crate) fn of_request(extensions: &Extensions) -> Option<Self> {
        extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(peer)| Client::of(peer.ip()))
    }
}

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

/// The request's [`Client`], as an extractor (`None` without connect info).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub Option<Client>);

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Peer(Client::of_request(&parts.extensions)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(text: &str) -> Client {
        Client::of(text.parse().unwrap())
    }

    #[test]
    fn ipv6_clients_are_grouped_by_their_64_prefix() {
        assert_eq!(client("2001:db8:1:2::1"), client("2001:db8:1:2:ffff:1:2:3"));
        assert_ne!(client("2001:db8:1:2::1"), client("2001:db8:1:3::1"));
        assert_eq!(
            client("2001:db8:1:2:aaaa::9").to_string(),
            "2001:db8:1:2::/64"
        );
    }

    #[test]
    fn ipv4_clients_are_their_address_however_reported() {
        assert_eq!(client("192.0.2.1"), client("::ffff:192.0.2.1"));
        assert_ne!(client("192.0.2.1"), client("192.0.2.2"));
        assert_eq!(client("::ffff:192.0.2.1").to_string(), "192.0.2.1");
    }

    #[test]
    fn the_peer_is_read_from_connect_info() {
        let mut extensions = Extensions::new();
        assert_eq!(Client::of_request(&extensions), None);
        extensions.insert(ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 4242))));
        assert_eq!(Client::of_request(&extensions), Some(client("127.0.0.1")));
    }
}
