//! The route table: the longest `path_prefix` that matches a request path wins. Pure.

/// Routes by path prefix, longest first.
#[derive(Debug, Clone)]
pub struct RouteTable<T> {
    entries: Vec<(String, T)>,
}

impl<T> RouteTable<T> {
    /// Builds the table; the order of `routes` does not matter.
    pub fn new(routes: impl IntoIterator<Item = (String, T)>) -> RouteTable<T> {
        let mut entries: Vec<(String, T)> = routes.into_iter().collect();
        entries.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        RouteTable { entries }
    }

    /// The route whose prefix is the longest that `path` starts with. A path equal to a prefix
    /// without its trailing slash (`/openai` for `/openai/`) matches it too.
    pub fn find(&self, path: &str) -> Option<(&str, &T)> {
        self.entries
            .iter()
            .find(|(prefix, _)| {
                path.starts_with(prefix.as_str())
                    || (prefix.ends_with('/') && prefix.len() > 1 && path == &prefix[..prefix.len() - 1])
            })
            .map(|(p, t)| (p.as_str(), t))
    }

    /// Every route, longest prefix first.
    pub(crate) fn routes(&self) -> impl Iterator<Item = &T> {
        self.entries.iter().map(|(_, t)| t)
    }
}

/// The path to forward: with `strip`, `path` minus `prefix`, keeping a leading slash.
pub(crate) fn forwarded_path<'a>(path: &'a str, prefix: &str, strip: bool) -> std::borrow::Cow<'a, str> {
    if !strip {
        return path.into();
    }
    let rest = path.strip_prefix(prefix.trim_end_matches('/')).unwrap_or(path);
    if rest.starts_with('/') {
        rest.into()
    } else {
        format!("/{rest}").into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> RouteTable<&'static str> {
        RouteTable::new([
            ("/openai/".to_string(), "openai"),
            ("/openai/v1/audio/".to_string(), "audio"),
            ("/anthropic/".to_string(), "anthropic"),
            ("/".to_string(), "catchall"),
        ])
    }

    #[test]
    fn longest_prefix_wins() {
        let t = table();
        let hit = |p: &str| t.find(p).map(|(_, r)| *r);
        assert_eq!(hit("/openai/v1/chat/completions"), Some("openai"));
        assert_eq!(hit("/openai/v1/audio/speech"), Some("audio"));
        assert_eq!(hit("/anthropic/v1/messages"), Some("anthropic"));
        assert_eq!(hit("/openai"), Some("openai"));
        assert_eq!(hit("/openaix/v1"), Some("catchall"));
        assert_eq!(hit("/other"), Some("catchall"));
    }

    #[test]
    fn no_match_without_catchall() {
        let t = RouteTable::new([("/openai/".to_string(), 1)]);
        assert!(t.find("/anthropic/v1").is_none());
        assert!(t.find("/").is_none());
    }

    #[test]
    fn strips_prefixes() {
        assert_eq!(forwarded_path("/openai/v1/chat", "/openai/", true), "/v1/chat");
        assert_eq!(forwarded_path("/openai/v1/chat", "/openai/", false), "/openai/v1/chat");
        assert_eq!(forwarded_path("/openai", "/openai/", true), "/");
        assert_eq!(forwarded_path("/openai/", "/openai/", true), "/");
        assert_eq!(forwarded_path("/x/y", "/", true), "/x/y");
    }
}
