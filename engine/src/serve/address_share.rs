//! Each client address's share of the open connections: at most
//! [`Limits::max_connections_per_address`](super::Limits::max_connections_per_address)
//! at once, so that one client cannot hold every connection the server has.
//!
//! Hand-written, as the accept loop's cap is: tower's limits count requests
//! inside a service, and this counts connections before any service sees
//! them. A map from address to count behind a mutex, touched once when a
//! connection opens and once when it closes; an address leaves the map with
//! its last connection, so the map never holds more entries than there are
//! open connections.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Who a connection counts against: an IPv4 address, or an IPv6 /64 (one
/// host usually has a whole /64 to pick addresses from). An IPv4 address
/// mapped into IPv6 counts as the IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ClientKey {
    /// One IPv4 address.
    V4(u32),
    /// The first 64 bits of an IPv6 address.
    V6Prefix(u64),
}

impl From<IpAddr> for ClientKey {
    fn from(address: IpAddr) -> Self {
        match address {
            IpAddr::V4(v4) => ClientKey::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => ClientKey::V4(u32::from(v4)),
                None => ClientKey::V6Prefix((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

/// The open connections per client.
#[derive(Debug)]
pub(crate) struct AddressShares {
    per_client: usize,
    open: Arc<Mutex<HashMap<ClientKey, usize>>>,
}

/// One open connection's place in its client's share; given back on drop.
#[derive(Debug)]
pub(crate) struct SharePermit {
    key: ClientKey,
    open: Arc<Mutex<HashMap<ClientKey, usize>>>,
}

impl AddressShares {
    /// Shares of at most `per_client` connections each.
    pub(crate) fn new(per_client: usize) -> Self {
        Self {
            per_client: per_client.max(1),
            open: Arc::default(),
        }
    }

    /// A place for one more connection from `address`, or `None` when its
    /// client already holds its share.
    pub(crate) fn try_take(&self, address: IpAddr) -> Option<SharePermit> {
        let key = ClientKey::from(address);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(key).or_insert(0);
        if *count >= self.per_client {
            return None;
        }
        *count += 1;
        Some(SharePermit {
            key,
            open: Arc::clone(&self.open),
        })
    }

    /// How many clients hold connections now (for tests).
    #[cfg(test)]
    fn clients(&self) -> usize {
        self.open.lock().map(|open| open.len()).unwrap_or(0)
    }
}

impl Drop for SharePermit {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn each_client_gets_its_share_and_gets_it_back() {
        let shares = AddressShares::new(2);
        let first = shares.try_take(ip("192.0.2.1")).unwrap();
        let _second = shares.try_take(ip("192.0.2.1")).unwrap();
        assert!(shares.try_take(ip("192.0.2.1")).is_none());
        // Another client is not affected.
        let other = shares.try_take(ip("192.0.2.2")).unwrap();
        drop(first);
        assert!(shares.try_take(ip("192.0.2.1")).is_some());
        drop(other);
        assert_eq!(
            shares.clients(),
            1,
            "a client leaves with its last connection"
        );
    }

    #[test]
    fn an_ipv6_host_is_its_slash_64() {
        let shares = AddressShares::new(1);
        let _held = shares.try_take(ip("2001:db8:1:2::1")).unwrap();
        assert!(shares.try_take(ip("2001:db8:1:2:ffff::9")).is_none());
        assert!(shares.try_take(ip("2001:db8:1:3::1")).is_some());
        // An IPv4-mapped address is the IPv4 address.
        let _v4 = shares.try_take(ip("198.51.100.7")).unwrap();
        assert!(shares.try_take(ip("::ffff:198.51.100.7")).is_none());
    }

    #[test]
    fn the_map_holds_only_clients_with_open_connections() {
        let shares = AddressShares::new(4);
        let permits: Vec<_> = (0..100u8)
            .filter_map(|i| shares.try_take(IpAddr::from([10, 0, 0, i])))
            .collect();
        assert_eq!(shares.clients(), 100);
        drop(permits);
        assert_eq!(shares.clients(), 0);
    }
}
