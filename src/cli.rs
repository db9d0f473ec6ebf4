//! `rebound dead-letters list|summary|replay|purge`: the admin API from a terminal. Readable
//! tables by default, `--json` for scripts.

use std::fmt::Write as _;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::dead_letters::{DeadLetter, Page, Summary};

/// What to do.
#[derive(Debug, Clone)]
pub enum Action {
    List { limit: usize, cursor: Option<String> },
    Summary,
    Replay { id: Option<String> },
    Purge,
}

/// A dead-letters command, resolved.
#[derive(Debug, Clone)]
pub struct Command {
    /// `http://host:port` of the admin listener.
    pub admin: String,
    pub token: String,
    pub action: Action,
    /// `route=`, `reason=`, `upstream=`, `since=` pairs.
    pub filter: Vec<(&'static str, String)>,
    pub json: bool,
}

/// Runs the command; returns what to print, or an error message.
pub async fn run(cmd: &Command) -> Result<String, String> {
    let mut query: Vec<String> = cmd.filter.iter().map(|(k, v)| format!("{k}={}", encode(v))).collect();
    let (method, path) = match &cmd.action {
        Action::List { limit, cursor } => {
            query.push(format!("limit={limit}"));
            if let Some(c) = cursor {
                query.push(format!("cursor={}", encode(c)));
            }
            (Method::GET, "/admin/dead-letters".to_string())
        }
        Action::Summary => (Method::GET, "/admin/dead-letters/summary".to_string()),
        Action::Replay { id: Some(id) } => (Method::POST, format!("/admin/dead-letters/{}/replay", encode(id))),
        Action::Replay { id: None } => (Method::POST, "/admin/dead-letters/replay".to_string()),
        Action::Purge => (Method::DELETE, "/admin/dead-letters".to_string()),
    };
    let url = format!("{}{path}?{}", cmd.admin.trim_end_matches('/'), query.join("&"));
    let req = Request::builder()
        .method(method)
        .uri(&url)
        .header("authorization", format!("Bearer {}", cmd.token))
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("bad admin URL {url}: {e}"))?;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let resp = client
        .request(req)
        .await
        .map_err(|e| format!("cannot reach the admin API at {}: {e}", cmd.admin))?;
    let status = resp.status();
    let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    let value: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    if !status.is_success() {
        let msg = value["error"]["message"].as_str().unwrap_or("").to_string();
        return Err(format!("admin API answered {status}: {msg}"));
    }
    if cmd.json {
        return Ok(format!("{}\n", String::from_utf8_lossy(&body)));
    }
    Ok(match &cmd.action {
        Action::List { .. } => serde_json::from_value::<Page>(value)
            .map(|p| list_table(&p))
            .map_err(|e| e.to_string())?,
        Action::Summary => serde_json::from_value::<Summary>(value)
            .map(|s| summary_table(&s))
            .map_err(|e| e.to_string())?,
        // Nothing could be replayed: said on stderr, with a failing exit status.
        Action::Replay { .. } => match replay_text(&value) {
            (text, true) => text,
            (text, false) => return Err(text.trim_end().to_string()),
        },
        Action::Purge => format!("purged {} dead letter(s)\n", value["purged"]),
    })
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A table with columns padded to their widest cell.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let last = cells.len().saturating_sub(1);
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                let _ = write!(out, "{cell:<w$}  ");
            }
        }
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for row in rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

fn list_table(page: &Page) -> String {
    if page.items.is_empty() {
        return "no dead letters\n".into();
    }
    let rows: Vec<Vec<String>> = page.items.iter().map(list_row).collect();
    let mut out = table(
        &[
            "ID",
            "TIME (UTC)",
            "ROUTE",
            "UPSTREAM",
            "REASON",
            "CLASS",
            "STATUS",
            "ATTEMPTS",
            "REPLAYS",
            "REQUEST",
        ],
        &rows,
    );
    if let Some(c) = &page.next_cursor {
        let _ = writeln!(out, "more: --cursor {c}");
    }
    out
}

fn list_row(e: &DeadLetter) -> Vec<String> {
    let replays = match e.replays.last() {
        None => "-".to_string(),
        Some(r) => format!(
            "{} (last {}{})",
            e.replays.len(),
            r.status,
            if r.from_store { ", from store" } else { "" }
        ),
    };
    vec![
        e.id.clone(),
        utc(e.time_ms),
        e.route.clone(),
        e.upstream.clone(),
        e.reason.clone(),
        e.error_class.clone(),
        e.final_status.to_string(),
        e.attempts.len().to_string(),
        replays,
        format!("{} {}", e.method, e.path),
    ]
}

fn summary_table(s: &Summary) -> String {
    if s.groups.is_empty() {
        return "no dead letters\n".into();
    }
    let rows: Vec<Vec<String>> = s
        .groups
        .iter()
        .map(|g| {
            let verdict = g.analysis.as_ref().map_or("-".to_string(), |a| {
                serde_json::to_value(a.verdict)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            });
            vec![
                g.key.clone(),
                g.count.to_string(),
                g.route.clone(),
                g.upstream.clone(),
                g.reason.clone(),
                g.error_class.clone(),
                g.final_status.to_string(),
                utc(g.first_seen_ms),
                utc(g.last_seen_ms),
                verdict,
            ]
        })
        .collect();
    let mut out = table(
        &[
            "GROUP",
            "COUNT",
            "ROUTE",
            "UPSTREAM",
            "REASON",
            "CLASS",
            "STATUS",
            "FIRST SEEN",
            "LAST SEEN",
            "VERDICT",
        ],
        &rows,
    );
    let _ = write!(out, "total: {}", s.total);
    if s.truncated {
        out.push_str(" (the read stopped at its bound: the oldest entries of the window are not counted)");
    }
    out.push('\n');
    for g in &s.groups {
        let _ = write!(out, "\n{}", g.key);
        if let Some(m) = &g.message {
            let _ = write!(out, "  {m}");
        }
        out.push('\n');
        if let Some(a) = &g.analysis {
            let _ = writeln!(out, "  {}", a.line);
        }
    }
    out
}

/// What a replay did, and whether anything was replayed (sent upstream, whatever its answer).
fn replay_text(v: &serde_json::Value) -> (String, bool) {
    let one = |r: &serde_json::Value| {
        let id = r["id"].as_str().unwrap_or("?");
        match r["error"].as_str() {
            Some(e) => format!("{id}: not replayed: {e}\n"),
            None if r["from_store"].as_bool() == Some(true) => {
                format!(
                    "{id}: {} (answered from the idempotency store: it had already succeeded)\n",
                    r["status"]
                )
            }
            None => format!("{id}: {}\n", r["status"]),
        }
    };
    match v["results"].as_array() {
        Some(results) => {
            let mut out: String = results.iter().map(one).collect();
            let _ = write!(
                out,
                "replayed {}, succeeded {}, skipped {}",
                v["replayed"], v["succeeded"], v["skipped"]
            );
            if let Some(reasons) = v["skipped_reasons"].as_object().filter(|r| !r.is_empty()) {
                let why: Vec<String> = reasons.iter().map(|(r, n)| format!("{n}: {r}")).collect();
                let _ = write!(out, " ({})", why.join("; "));
            }
            out.push('\n');
            let replayed = v["replayed"].as_u64().unwrap_or(0);
            (out, replayed > 0 || results.is_empty())
        }
        None => (one(v), v["error"].is_null()),
    }
}

/// `2026-11-29 10:04:05` from unix milliseconds (UTC).
pub(crate) fn utc(ms: u64) -> String {
    crate::time::utc(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_795_947_845_000), "2026-11-29 10:24:05");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
    }

    #[test]
    fn tables_align() {
        let t = table(&["A", "BB"], &[vec!["xxx".into(), "y".into()]]);
        assert_eq!(t, "A    BB\nxxx  y\n");
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
    }
}
