//! Test configs edited as TOML documents, never as text: every edit names a table or key that
//! must exist (or, for `set`, a table that must exist), so a test whose base config changed fails
//! loudly instead of silently testing something else.

use toml_edit::{value, DocumentMut, Item, Table, Value};

/// A config being edited.
pub struct Edit {
    doc: DocumentMut,
}

impl Edit {
    pub fn new(text: &str) -> Edit {
        Edit {
            doc: text
                .parse()
                .unwrap_or_else(|e| panic!("base config is not TOML: {e}\n{text}")),
        }
    }

    /// The table at dotted `path` (`server`, `retry.fast`), which must exist.
    fn table(&mut self, path: &str) -> &mut Table {
        let mut item = self.doc.as_item_mut();
        for k in path.split('.') {
            item = item
                .get_mut(k)
                .unwrap_or_else(|| panic!("[{path}] is not in the config (no {k:?})"));
        }
        item.as_table_mut().unwrap_or_else(|| panic!("[{path}] is not a table"))
    }

    /// The `[[routes]]` entry named `name`, which must exist.
    fn route(&mut self, name: &str) -> &mut Table {
        let routes = self
            .doc
            .get_mut("routes")
            .and_then(Item::as_array_of_tables_mut)
            .unwrap_or_else(|| panic!("the config has no [[routes]]"));
        routes
            .iter_mut()
            .find(|t| t.get("name").and_then(Item::as_str) == Some(name))
            .unwrap_or_else(|| panic!("no route named {name:?}"))
    }

    /// Sets `key` in the existing table `table` (a new key or a changed one).
    pub fn set(mut self, table: &str, key: &str, v: impl Into<Value>) -> Edit {
        self.table(table).insert(key, value(v));
        self
    }

    /// Changes `key` of `table`; the key must already be there.
    pub fn change(mut self, table: &str, key: &str, v: impl Into<Value>) -> Edit {
        let t = self.table(table);
        assert!(t.contains_key(key), "[{table}] has no {key:?} to change");
        t.insert(key, value(v));
        self
    }

    /// Removes `key` of `table`; the key must be there.
    pub fn remove(mut self, table: &str, key: &str) -> Edit {
        assert!(
            self.table(table).remove(key).is_some(),
            "[{table}] has no {key:?} to remove"
        );
        self
    }

    /// Sets `key` on the route named `route`.
    pub fn route_set(mut self, route: &str, key: &str, v: impl Into<Value>) -> Edit {
        self.route(route).insert(key, value(v));
        self
    }

    /// Adds a table of `key = value` pairs at `path` (`retry.fast`), creating parents.
    pub fn add_table(mut self, path: &str, pairs: &[(&str, Value)]) -> Edit {
        let mut item = self.doc.as_item_mut();
        for k in path.split('.') {
            let parent = item
                .as_table_like_mut()
                .unwrap_or_else(|| panic!("{path}: {k} under a non-table"));
            if parent.get(k).is_none() {
                let mut t = Table::new();
                t.set_implicit(true);
                parent.insert(k, Item::Table(t));
            }
            item = parent.get_mut(k).unwrap_or_else(|| panic!("{path}: {k}"));
        }
        let t = item.as_table_mut().unwrap_or_else(|| panic!("[{path}] is not a table"));
        t.set_implicit(false);
        for (k, v) in pairs {
            t.insert(k, value(v.clone()));
        }
        self
    }
}

impl std::fmt::Display for Edit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.doc)
    }
}

#[test]
fn edits_fail_loudly_on_a_missing_table_route_or_key() {
    let base = "[server]\nlisten = \"a\"\n\n[[routes]]\nname = \"fake\"\n";
    let edited = Edit::new(base)
        .change("server", "listen", "b")
        .set("server", "shutdown_grace", "1s")
        .route_set("fake", "retry", "fast")
        .add_table("retry.fast", &[("max_attempts", 2.into())])
        .to_string();
    let doc: DocumentMut = edited.parse().unwrap();
    assert_eq!(doc["server"]["listen"].as_str(), Some("b"));
    assert_eq!(doc["server"]["shutdown_grace"].as_str(), Some("1s"));
    assert_eq!(doc["routes"][0]["retry"].as_str(), Some("fast"));
    assert_eq!(doc["retry"]["fast"]["max_attempts"].as_integer(), Some(2));

    let missing = |f: fn(Edit) -> Edit| std::panic::catch_unwind(|| f(Edit::new(base))).is_err();
    assert!(missing(|e| e.set("admin", "token", "t")), "no [admin]");
    assert!(missing(|e| e.change("server", "nope", "x")), "no such key");
    assert!(missing(|e| e.remove("server", "nope")), "no such key");
    assert!(missing(|e| e.route_set("other", "retry", "x")), "no such route");
}
