//! The shipped `config/rebound.toml`, read from disk, with only what a test must replace edited in
//! by a TOML edit (the provider URLs, the listeners, Redis): tests of what a new user gets.

use std::path::{Path, PathBuf};

pub fn path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/rebound.toml")
}

/// Sets `path` (dotted) in `doc` to the string `value`; the key must already exist, so that an
/// edit can never silently miss.
pub fn set(doc: &mut toml_edit::DocumentMut, path: &str, value: &str) {
    let mut keys = path.split('.');
    let first = keys.next().unwrap();
    let mut item = doc
        .get_mut(first)
        .unwrap_or_else(|| panic!("[{first}] not in rebound.toml"));
    for k in keys {
        item = item.get_mut(k).unwrap_or_else(|| panic!("{path} not in rebound.toml"));
    }
    assert!(item.is_str(), "{path} is not a string in rebound.toml");
    *item = toml_edit::value(value);
}

/// The shipped config with both providers at `provider_url` (speaking the APIs of the hosts they
/// stand in for), both listeners on free ports, and
/// `edits` (dotted key, new value) applied on top.
pub fn doc(provider_url: &str, edits: &[(&str, &str)]) -> toml_edit::DocumentMut {
    let text = std::fs::read_to_string(path()).unwrap();
    let mut doc: toml_edit::DocumentMut = text.parse().unwrap();
    set(&mut doc, "upstreams.openai.url", provider_url);
    set(&mut doc, "upstreams.anthropic.url", provider_url);
    // A loopback URL says no API: each keeps the one its shipped host says.
    for (upstream, api) in [("openai", "openai"), ("anthropic", "anthropic")] {
        doc["upstreams"][upstream]["api"] = toml_edit::value(api);
    }
    set(&mut doc, "server.listen", "127.0.0.1:0");
    set(&mut doc, "admin.listen", "127.0.0.1:0");
    for (k, v) in edits {
        set(&mut doc, k, v);
    }
    doc
}

/// [`doc`] with `[redis] url = redis_url` added (nothing else of `[redis]`: its defaults).
pub fn with_redis(provider_url: &str, redis_url: &str, edits: &[(&str, &str)]) -> String {
    let mut doc = doc(provider_url, edits);
    let mut redis = toml_edit::Table::new();
    redis.insert("url", toml_edit::value(redis_url));
    doc.insert("redis", toml_edit::Item::Table(redis));
    doc.to_string()
}

/// The edited shipped config, parsed (as if read from its own path).
pub fn parse(doc: &toml_edit::DocumentMut) -> rebound::Config {
    rebound::Config::parse(&doc.to_string(), &path(), &|_| None)
        .unwrap_or_else(|e| panic!("edited rebound.toml invalid:\n{e}"))
}
