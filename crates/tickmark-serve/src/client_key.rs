//! Who a connection counts against: each client's share of the open
//! connections ([`Limits::max_connections_per_address`](super::Limits::max_connections_per_address),
//! and its fair share at the cap: [`ConnectionTable`](super::connection_table::ConnectionTable))
//! is counted per [`ClientKey`], not per socket address.

use std::net::IpAddr;

/// Who a connection counts against: an IPv4 address, or an IPv6 /64 (one
/// host usually has a whole /64 to pick addresses from). An IPv4 address
/// mapped into IPv6 counts as the IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientKey {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> ClientKey {
        ClientKey::from(text.parse::<IpAddr>().unwrap())
    }

    #[test]
    fn an_ipv6_host_is_its_slash_64_and_a_mapped_ipv4_is_the_ipv4() {
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("198.51.100.7"), key("::ffff:198.51.100.7"));
        assert_ne!(key("198.51.100.7"), key("198.51.100.8"));
    }
}
