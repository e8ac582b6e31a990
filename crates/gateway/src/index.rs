//! Listing: the pure part. Given every entry of a bucket's index in key order, produce one page
//! of an S3 listing (prefix, delimiter, marker, max-keys), and the URL encoding clients may ask
//! for.

use crate::layout::IndexEntry;

/// S3's default and largest page.
pub const MAX_KEYS_DEFAULT: usize = 1000;

/// One page of a listing.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Page {
    /// Objects, in key order.
    pub objects: Vec<(String, IndexEntry)>,
    /// Common prefixes, in order.
    pub prefixes: Vec<String>,
    /// Whether more follows.
    pub truncated: bool,
    /// What to pass as the marker to get the next page, when truncated.
    pub next_marker: Option<String>,
}

/// What to list.
#[derive(Debug, Default, Clone)]
pub struct Query<'a> {
    /// Only keys starting with this.
    pub prefix: &'a str,
    /// Roll keys up to the first occurrence of this after the prefix.
    pub delimiter: Option<&'a str>,
    /// Only keys (or common prefixes) after this.
    pub marker: Option<&'a str>,
    /// Most objects plus prefixes in the page.
    pub max_keys: usize,
}

/// The common prefix `key` rolls up into, if any.
pub(crate) fn common_prefix<'k>(
    key: &'k str,
    prefix: &str,
    delimiter: Option<&str>,
) -> Option<&'k str> {
    let delimiter = delimiter.filter(|d| !d.is_empty())?;
    let rest = key.get(prefix.len()..)?;
    let at = rest.find(delimiter)?;
    key.get(..prefix.len() + at + delimiter.len())
}

/// One page of the listing of `entries` (sorted by key) under `query`.
pub fn list<'e>(
    entries: impl IntoIterator<Item = (&'e String, &'e IndexEntry)>,
    query: &Query<'_>,
) -> Page {
    let mut page = Page::default();
    if query.max_keys == 0 {
        return page;
    }
    let mut last: Option<String> = None;
    for (key, entry) in entries {
        if !key.starts_with(query.prefix) {
            continue;
        }
        let rolled = common_prefix(key, query.prefix, query.delimiter);
        if let Some(marker) = query.marker {
            // A marker that is a common prefix skips every key under it, not just keys up to it.
            if key.as_str() <= marker || rolled == Some(marker) {
                continue;
            }
        }
        if let Some(p) = rolled
            && page.prefixes.last().map(String::as_str) == Some(p)
        {
            continue;
        }
        if page.objects.len() + page.prefixes.len() >= query.max_keys {
            page.truncated = true;
            page.next_marker = last;
            return page;
        }
        match rolled {
            Some(p) => {
                page.prefixes.push(p.to_owned());
                last = Some(p.to_owned());
            }
            None => {
                page.objects.push((key.clone(), entry.clone()));
                last = Some(key.clone());
            }
        }
    }
    page
}

/// S3's `encoding-type=url`: percent-encodes everything but unreserved characters and `/`.
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for byte in s.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn index(keys: &[&str]) -> BTreeMap<String, IndexEntry> {
        keys.iter()
            .map(|k| {
                (
                    (*k).to_owned(),
                    IndexEntry {
                        size: k.len() as u64,
                        etag: String::new(),
                        last_modified_ms: 0,
                    },
                )
            })
            .collect()
    }

    fn keys(page: &Page) -> Vec<&str> {
        page.objects.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn prefix_and_delimiter_roll_up() {
        let idx = index(&["a.txt", "dir/x", "dir/y", "dir/sub/z", "dix", "e/f"]);
        let page = list(
            &idx,
            &Query {
                delimiter: Some("/"),
                max_keys: 1000,
                ..Query::default()
            },
        );
        assert_eq!(keys(&page), ["a.txt", "dix"]);
        assert_eq!(page.prefixes, ["dir/", "e/"]);
        assert!(!page.truncated);
        let page = list(
            &idx,
            &Query {
                prefix: "dir/",
                delimiter: Some("/"),
                max_keys: 1000,
                ..Query::default()
            },
        );
        assert_eq!(keys(&page), ["dir/x", "dir/y"]);
        assert_eq!(page.prefixes, ["dir/sub/"]);
    }

    #[test]
    fn pages_continue_where_they_stopped_and_cover_everything_once() {
        let names: Vec<String> = (0..25)
            .map(|i| {
                if i % 5 == 0 {
                    format!("p{i:02}/a")
                } else {
                    format!("k{i:02}")
                }
            })
            .chain((0..3).map(|i| format!("p00/b{i}")))
            .collect();
        let idx = index(&names.iter().map(String::as_str).collect::<Vec<_>>());
        for max_keys in [1, 2, 3, 7, 1000] {
            let mut seen_keys = Vec::new();
            let mut seen_prefixes = Vec::new();
            let mut marker: Option<String> = None;
            loop {
                let page = list(
                    &idx,
                    &Query {
                        delimiter: Some("/"),
                        marker: marker.as_deref(),
                        max_keys,
                        ..Query::default()
                    },
                );
                assert!(page.objects.len() + page.prefixes.len() <= max_keys);
                seen_keys.extend(page.objects.iter().map(|(k, _)| k.clone()));
                seen_prefixes.extend(page.prefixes.iter().cloned());
                if !page.truncated {
                    break;
                }
                marker = page.next_marker;
                assert!(marker.is_some());
            }
            assert_eq!(seen_keys.len(), 20, "max_keys {max_keys}");
            assert_eq!(seen_prefixes, ["p00/", "p05/", "p10/", "p15/", "p20/"]);
        }
    }

    #[test]
    fn max_keys_zero_lists_nothing() {
        let idx = index(&["a"]);
        let page = list(&idx, &Query::default());
        assert!(page.objects.is_empty() && page.prefixes.is_empty());
    }

    #[test]
    fn url_encoding_keeps_slashes() {
        assert_eq!(url_encode("a b/c+d%é"), "a%20b/c%2Bd%25%C3%A9");
    }
}
