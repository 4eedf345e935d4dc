//! Cursor pagination of the deliveries lists: `per_page` (default 30, max
//! 100) and `cursor` ("the starting delivery from which the page of
//! deliveries is fetched. Refer to the `link` header for the next and
//! previous page cursors"), newest first, with a `Link` header carrying the
//! full URLs of the next and previous pages.
//! <https://docs.github.com/en/rest/repos/webhooks#list-deliveries-for-a-repository-webhook>,
//! <https://docs.github.com/en/rest/using-the-rest-api/using-pagination-in-the-rest-api>
//! ("The `per_page` parameter will automatically be included in the `link` header").

use super::error::ApiError;
use super::model::StatusFilter;

/// Items per page when `per_page` is absent.
pub const DEFAULT_PER_PAGE: usize = 30;
/// The most items a page holds (a larger `per_page` is cut to it).
pub const MAX_PER_PAGE: usize = 100;

/// Where a page starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cursor {
    /// The newest deliveries.
    Start,
    /// From this delivery id on, older ones after it (`v1_<id>`; rel="next").
    From(u64),
    /// The `per_page` deliveries just newer than this id (`v1_before_<id>`;
    /// rel="prev").
    Before(u64),
}

impl Cursor {
    fn parse(text: &str) -> Result<Self, ApiError> {
        let invalid = || ApiError::Validation(format!("invalid cursor `{text}`"));
        if let Some(id) = text.strip_prefix("v1_before_") {
            return id.parse().map(Cursor::Before).map_err(|_| invalid());
        }
        let id = text.strip_prefix("v1_").ok_or_else(invalid)?;
        id.parse().map(Cursor::From).map_err(|_| invalid())
    }

    fn render(self) -> Option<String> {
        match self {
            Cursor::Start => None,
            Cursor::From(id) => Some(format!("v1_{id}")),
            Cursor::Before(id) => Some(format!("v1_before_{id}")),
        }
    }
}

/// The list endpoints' query, parsed strictly: `per_page`, `cursor`,
/// `status`; other parameters are ignored, as GitHub ignores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ListQuery {
    pub per_page: usize,
    pub cursor: Cursor,
    pub status: StatusFilter,
}

impl ListQuery {
    /// Parse the raw query string.
    pub fn parse(raw: Option<&str>) -> Result<Self, ApiError> {
        let mut query = ListQuery {
            per_page: DEFAULT_PER_PAGE,
            cursor: Cursor::Start,
            status: StatusFilter::Any,
        };
        for (name, value) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            match name.as_ref() {
                "per_page" => {
                    let n: usize = value.parse().map_err(|_| {
                        ApiError::Validation(format!("per_page `{value}` is not an integer"))
                    })?;
                    query.per_page = n.clamp(1, MAX_PER_PAGE);
                }
                "cursor" => query.cursor = Cursor::parse(&value)?,
                "status" => {
                    query.status = match value.as_ref() {
                        "success" => StatusFilter::Success,
                        "failure" => StatusFilter::Failure,
                        other => {
                            return Err(ApiError::Validation(format!(
                                "status `{other}` is not one of success, failure"
                            )))
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(query)
    }
}

/// One page of ids, and the cursors of its neighbours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Page {
    pub ids: Vec<u64>,
    pub next: Option<Cursor>,
    pub prev: Option<Cursor>,
}

/// Cut the page `query` asks for out of `newest_first` (delivery ids, newest
/// first, already filtered).
pub(crate) fn page(newest_first: &[u64], query: &ListQuery) -> Page {
    let start = match query.cursor {
        Cursor::Start => 0,
        Cursor::From(id) => newest_first
            .iter()
            .position(|&d| d <= id)
            .unwrap_or(newest_first.len()),
        Cursor::Before(id) => {
            let first_older_or_same = newest_first
                .iter()
                .position(|&d| d <= id)
                .unwrap_or(newest_first.len());
            first_older_or_same.saturating_sub(query.per_page)
        }
    };
    let end = (start + query.per_page).min(newest_first.len());
    let ids = newest_first[start..end].to_vec();
    let next = newest_first.get(end).map(|&id| Cursor::From(id));
    let prev = if start > 0 {
        ids.first().map(|&id| Cursor::Before(id))
    } else {
        None
    };
    Page { ids, next, prev }
}

/// The `Link` header for `page`, or None when it is the only page.
pub(crate) fn link_header(
    base_url: &str,
    path: &str,
    query: &ListQuery,
    page: &Page,
) -> Option<String> {
    let url = |cursor: Cursor| {
        let mut serializer = form_urlencoded::Serializer::new(String::new());
        serializer.append_pair("per_page", &query.per_page.to_string());
        if let Some(cursor) = cursor.render() {
            serializer.append_pair("cursor", &cursor);
        }
        match query.status {
            StatusFilter::Any => {}
            StatusFilter::Success => {
                serializer.append_pair("status", "success");
            }
            StatusFilter::Failure => {
                serializer.append_pair("status", "failure");
            }
        }
        format!("{base_url}{path}?{}", serializer.finish())
    };
    let mut links = Vec::new();
    if let Some(prev) = page.prev {
        links.push(format!("<{}>; rel=\"prev\"", url(prev)));
    }
    if let Some(next) = page.next {
        links.push(format!("<{}>; rel=\"next\"", url(next)));
    }
    (!links.is_empty()).then(|| links.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(per_page: usize, cursor: Cursor) -> ListQuery {
        ListQuery {
            per_page,
            cursor,
            status: StatusFilter::Any,
        }
    }

    #[test]
    fn pages_walk_forward_and_back() {
        let ids = [7, 6, 5, 4, 3, 2, 1];
        let first = page(&ids, &query(3, Cursor::Start));
        assert_eq!(first.ids, [7, 6, 5]);
        assert_eq!(first.prev, None);
        let second = page(&ids, &query(3, first.next.unwrap()));
        assert_eq!(second.ids, [4, 3, 2]);
        let back = page(&ids, &query(3, second.prev.unwrap()));
        assert_eq!(back.ids, [7, 6, 5]);
        let last = page(&ids, &query(3, second.next.unwrap()));
        assert_eq!(last.ids, [1]);
        assert_eq!(last.next, None);
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert!(ListQuery::parse(Some("per_page=x")).is_err());
        assert!(ListQuery::parse(Some("cursor=abc")).is_err());
        assert!(ListQuery::parse(Some("status=ok")).is_err());
        assert_eq!(
            ListQuery::parse(Some("per_page=500")).unwrap().per_page,
            100
        );
    }
}
