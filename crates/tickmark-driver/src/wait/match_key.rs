//! The key a wait and the events that can settle it meet on.

/// `{source}␟{kind}␟{pointers}␟{value}`: what a waiting event waits on, and
/// what an accepted event of that source and kind is recorded under (once
/// per key some handler waits with). The pointers are part of the key, so
/// two waits keyed by different fields of one kind never meet by accident.
pub fn match_key(source: &str, kind: &str, pointers: &[String], value: &str) -> String {
    format!(
        "{source}\u{1f}{kind}\u{1f}{}\u{1f}{value}",
        pointers.join(",")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pointers_are_part_of_the_key() {
        let by_id = match_key("shopify", "orders/paid", &["/id".into()], "7");
        let by_name = match_key("shopify", "orders/paid", &["/name".into()], "7");
        assert_ne!(by_id, by_name);
        assert_eq!(by_id, "shopify\u{1f}orders/paid\u{1f}/id\u{1f}7");
    }
}
