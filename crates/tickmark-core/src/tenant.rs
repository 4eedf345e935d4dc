//! Where an event's tenant comes from, for fair claiming
//! (docs/flow_control.md, "Fair share across tenants"), and the name it is
//! stored under.

use sha2::{Digest, Sha256};

use tickmark_driver::flow::FlowKey;

/// The longest tenant name stored as it is, in bytes. A longer one (a
/// payload or a header that lies) is stored as `sha256:` and the hex of its
/// SHA-256: still one tenant, always the same, and an index entry of a
/// bounded size (PostgreSQL refuses a B-tree entry over about 2.7 kB, and
/// would refuse the accept).
pub const MAX_TENANT_BYTES: usize = 200;

/// Where a handler finds an event's tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantKey {
    /// JSON pointers into the payload, joined with `:` ([`FlowKey`]).
    Payload(FlowKey),
    /// A request header of the delivery, by its lower-case name (the
    /// receiver reads it; `Engine::accept` callers pass the tenant with
    /// `NewEvent::with_tenant`).
    Header(String),
}

impl TenantKey {
    /// The header `name` (any case), checked: letters, digits, `-` and `_`,
    /// 1 to 64 of them; `None` for anything else (`Handler::tenant_header`
    /// makes that a configuration error).
    pub fn header(name: &str) -> Option<Self> {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_');
        valid.then(|| Self::Header(name.to_ascii_lowercase()))
    }
}

/// The name a tenant is stored under: `value` itself, or when it is longer
/// than [`MAX_TENANT_BYTES`], `sha256:` and the hex of its digest.
pub fn tenant_name(value: String) -> String {
    if value.len() <= MAX_TENANT_BYTES {
        return value;
    }
    format!("sha256:{}", hex::encode(Sha256::digest(value.as_bytes())))
}

/// The tenant a delivery's header value names: the value when it is one
/// header of visible ASCII, not blank ([`tenant_name`] bounds it); `None`
/// otherwise (the event is then claimed outside any tenant's share).
pub fn tenant_from_header<'a>(mut values: impl Iterator<Item = &'a [u8]>) -> Option<String> {
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?.trim();
    let visible = !text.is_empty() && text.bytes().all(|byte| (0x20..0x7f).contains(&byte));
    visible.then(|| tenant_name(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_tenant_is_stored_as_its_digest() {
        assert_eq!(tenant_name("shop-1".into()), "shop-1");
        let long = "x".repeat(MAX_TENANT_BYTES + 1);
        let named = tenant_name(long.clone());
        assert!(
            named.starts_with("sha256:") && named.len() == 7 + 64,
            "{named}"
        );
        assert_eq!(named, tenant_name(long), "the same tenant every time");
        assert_eq!(
            tenant_name("y".repeat(MAX_TENANT_BYTES)).len(),
            MAX_TENANT_BYTES
        );
    }

    #[test]
    fn a_header_names_a_tenant_only_once_and_in_visible_text() {
        let one = [b"cool-shop.myshopify.com".as_slice()];
        assert_eq!(
            tenant_from_header(one.into_iter()).as_deref(),
            Some("cool-shop.myshopify.com")
        );
        assert_eq!(
            tenant_from_header([b"a".as_slice(), b"b"].into_iter()),
            None
        );
        assert_eq!(tenant_from_header([b"  ".as_slice()].into_iter()), None);
        assert_eq!(tenant_from_header([b"a\tb".as_slice()].into_iter()), None);
        assert_eq!(tenant_from_header([[0xff_u8].as_slice()].into_iter()), None);
        assert_eq!(tenant_from_header(std::iter::empty()), None);
    }

    #[test]
    fn header_names_are_checked_and_lowered() {
        assert_eq!(
            TenantKey::header("X-Shopify-Shop-Domain"),
            Some(TenantKey::Header("x-shopify-shop-domain".into()))
        );
        assert_eq!(TenantKey::header(""), None);
        assert_eq!(TenantKey::header("bad header"), None);
    }
}
