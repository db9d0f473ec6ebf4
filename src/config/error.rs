//! Configuration errors: each names the file, the line and column, the key, and what was expected.

use std::ops::Range;

use toml_edit::{ImDocument, Item, Table, Value};

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub line: Option<usize>,
    pub(crate) column: Option<usize>,
    /// Dotted key path, e.g. `routes[0].upstream` (empty for file-level problems).
    pub key: String,
    /// What was expected and what was found.
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(col) = self.column {
                write!(f, ":{col}")?;
            }
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Every problem found in one file (validation does not stop at the first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Why a configuration file could not be loaded ([`super::Config::load`]).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read: the I/O error is kept as the source.
    #[error("{file}: cannot read the file: {source}")]
    Read { file: String, source: std::io::Error },
    /// It was read and is not valid: every problem found.
    #[error(transparent)]
    Invalid(#[from] ConfigErrors),
}

/// Finds where keys are in the source text, for error positions.
pub(crate) struct Locator<'a> {
    src: &'a str,
    doc: Option<ImDocument<&'a str>>,
}

impl<'a> Locator<'a> {
    pub(super) fn new(src: &'a str) -> Locator<'a> {
        Locator {
            src,
            doc: ImDocument::parse(src).ok(),
        }
    }

    /// 1-based (line, column) of a byte offset.
    pub(crate) fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.src.len());
        let before = &self.src[..offset];
        let line = before.matches('\n').count() + 1;
        let col = before.rfind('\n').map_or(offset, |nl| offset - nl - 1) + 1;
        (line, col)
    }

    /// The span of the value at a dotted path such as `routes[1].upstream` or `upstreams.openai`:
    /// the deepest part of the path that exists.
    pub(crate) fn span_of(&self, path: &str) -> Option<Range<usize>> {
        let doc = self.doc.as_ref()?;
        let mut node = Node::Table(doc.as_table());
        let mut best = None;
        for seg in segments(path) {
            let Some((next, span)) = node.child(seg) else {
                break;
            };
            best = span.or(best);
            node = next;
        }
        best
    }

    /// The dotted key path whose value contains `offset` (innermost), for serde errors.
    pub(crate) fn path_at(&self, offset: usize) -> String {
        let Some(doc) = self.doc.as_ref() else {
            return String::new();
        };
        let mut path = String::new();
        walk_table(doc.as_table(), offset, &mut path);
        path
    }

    /// A located error for `key`.
    pub(super) fn error(&self, file: &str, key: &str, message: String) -> ConfigError {
        let (line, column) = match self.span_of(key) {
            Some(span) => {
                let (l, c) = self.line_col(span.start);
                (Some(l), Some(c))
            }
            None => (None, None),
        };
        ConfigError {
            file: file.to_string(),
            line,
            column,
            key: key.to_string(),
            message,
        }
    }
}

fn contains(span: Option<Range<usize>>, offset: usize) -> bool {
    span.is_some_and(|s| s.start <= offset && offset < s.end.max(s.start + 1))
}

fn push_key(path: &mut String, k: &str) {
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(k);
}

fn walk_table(t: &Table, offset: usize, path: &mut String) {
    // Tables' own spans cover only their header, so look at every child.
    for (k, item) in t.iter() {
        let key_span = t.key(k).and_then(|k| k.span());
        match item {
            Item::Table(child) => {
                let before = path.len();
                push_key(path, k);
                let mut inner = path.clone();
                walk_table(child, offset, &mut inner);
                if inner.len() > path.len() || contains(child.span(), offset) || contains(key_span, offset) {
                    *path = inner;
                    return;
                }
                path.truncate(before);
            }
            Item::ArrayOfTables(a) => {
                for (i, child) in a.iter().enumerate() {
                    let before = path.len();
                    push_key(path, k);
                    path.push_str(&format!("[{i}]"));
                    let mut inner = path.clone();
                    walk_table(child, offset, &mut inner);
                    if inner.len() > path.len() || contains(child.span(), offset) {
                        *path = inner;
                        return;
                    }
                    path.truncate(before);
                }
            }
            Item::Value(v) => {
                if contains(v.span(), offset) || contains(key_span, offset) {
                    push_key(path, k);
                    return;
                }
            }
            Item::None => {}
        }
    }
}

#[derive(Clone, Copy)]
enum Node<'a> {
    Table(&'a Table),
    Value(&'a Value),
    Tables(&'a toml_edit::ArrayOfTables),
}

impl<'a> Node<'a> {
    fn of(item: &'a Item) -> Option<Node<'a>> {
        match item {
            Item::Table(t) => Some(Node::Table(t)),
            Item::Value(v) => Some(Node::Value(v)),
            Item::ArrayOfTables(a) => Some(Node::Tables(a)),
            Item::None => None,
        }
    }

    fn child(self, seg: Seg<'_>) -> Option<(Node<'a>, Option<Range<usize>>)> {
        match (self, seg) {
            (Node::Table(t), Seg::Key(k)) => {
                let item = t.get(k)?;
                let span = item.span().or_else(|| t.key(k).and_then(|k| k.span()));
                Some((Node::of(item)?, span))
            }
            (Node::Value(Value::InlineTable(t)), Seg::Key(k)) => {
                let v = t.get(k)?;
                let span = v.span().or_else(|| t.key(k).and_then(|k| k.span()));
                Some((Node::Value(v), span))
            }
            (Node::Tables(a), Seg::Index(i)) => {
                let t = a.get(i)?;
                Some((Node::Table(t), t.span()))
            }
            (Node::Value(Value::Array(a)), Seg::Index(i)) => {
                let v = a.get(i)?;
                Some((Node::Value(v), v.span()))
            }
            _ => None,
        }
    }
}

#[derive(Clone, Copy)]
enum Seg<'p> {
    Key(&'p str),
    Index(usize),
}

fn segments(path: &str) -> Vec<Seg<'_>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (name, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !name.is_empty() {
            out.push(Seg::Key(name));
        }
        while let Some(end) = rest.find(']') {
            if let Ok(i) = rest[1..end].parse() {
                out.push(Seg::Index(i));
            }
            rest = &rest[end + 1..];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that cannot be read keeps its I/O error as the source, and reads as before.
    #[test]
    fn an_unreadable_file_keeps_its_io_error() {
        let path = std::path::Path::new("/nonexistent/rebound.toml");
        let Err(e) = crate::config::Config::load_with_env(path, &|_| None) else {
            panic!("a missing file loads");
        };
        assert!(
            e.to_string()
                .starts_with("/nonexistent/rebound.toml: cannot read the file: "),
            "{e}"
        );
        let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(source.map(std::io::Error::kind), Some(std::io::ErrorKind::NotFound));
    }

    const SRC: &str = "[server]\nlisten = \"x\"\n\n[upstreams.openai]\nurl = \"https://a\"\nset_headers = { authorization = \"k\" }\n\n[[routes]]\nname = \"a\"\n\n[[routes]]\nname = \"b\"\nupstream = \"nope\"\nfallback = [\"x\", \"y\"]\n";

    #[test]
    fn locates_keys() {
        let loc = Locator::new(SRC);
        let at = |p: &str| loc.line_col(loc.span_of(p).unwrap().start);
        assert_eq!(at("server.listen"), (2, 10));
        assert_eq!(at("upstreams.openai.url").0, 5);
        assert_eq!(at("upstreams.openai.set_headers.authorization").0, 6);
        assert_eq!(at("routes[1].upstream"), (13, 12));
        assert_eq!(at("routes[1].fallback[1]").0, 14);
        assert_eq!(at("routes[0].name").0, 9);
    }

    #[test]
    fn finds_the_path_at_an_offset() {
        let loc = Locator::new(SRC);
        let off = SRC.find("\"nope\"").unwrap();
        assert_eq!(loc.path_at(off), "routes[1].upstream");
        let off = SRC.find("\"https://a\"").unwrap();
        assert_eq!(loc.path_at(off), "upstreams.openai.url");
    }
}
