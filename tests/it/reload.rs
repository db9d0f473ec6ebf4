//! Hot reload under load: no request lost, invalid configs refused, the last valid one in force.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::config_builder::{some, TestConfig};
use crate::support::sidecar::ReboundProcess;
use crate::support::*;

/// The `fake` route, its upstream setting `x-config-version: VERSION`.
fn versioned(provider: &str, version: &str) -> TestConfig {
    TestConfig::new(provider).upstream(|u| {
        u.set_headers
            .insert("x-config-version".to_string(), version.to_string());
    })
}

#[tokio::test]
async fn reload_under_load_loses_nothing_and_refuses_an_invalid_config() {
    let provider = FakeProvider::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rebound.toml");
    std::fs::write(&path, versioned(&provider.url(), "1").toml()).unwrap();
    let config = rebound::Config::load_with_env(&path, &|_| None).unwrap();
    let rebound = Rebound::start_config(config).await;

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (url, stop, ok, failed) = (rebound.url.clone(), stop.clone(), ok.clone(), failed.clone());
        clients.spawn(async move {
            // Bounded: at most 20 s or 5000 requests per client.
            for _ in 0..5000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let a = send("GET", &format!("{url}/fake/echo"), &[("x-fake-key", "load")], "").await;
                if a.status == 200 { &ok } else { &failed }.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    let version_seen = |v: &str| {
        provider
            .requests("load")
            .last()
            .and_then(|r| r.header("x-config-version").map(|h| h == v))
            .unwrap_or(false)
    };
    assert!(eventually(Duration::from_secs(5), || version_seen("1")).await);

    // A valid change: picked up from the file, no signal needed.
    std::fs::write(&path, versioned(&provider.url(), "2").toml()).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || version_seen("2")).await,
        "the new config is in force"
    );

    // An invalid change: refused, counted, the running config stays.
    // A misspelt key does not compile in the typed config: it is added to the file as text.
    std::fs::write(
        &path,
        Edit::new(&versioned(&provider.url(), "3").toml())
            .set("server", "max_attemps", 1)
            .to_string(),
    )
    .unwrap();
    // The invalid config is refused and counted.
    until_metric(&rebound, r#"rebound_config_reloads_total{result="failure"}"#, |v| {
        v == 1.0
    })
    .await;
    // Counted as refused: the reload is over, what is in force now stays.
    assert!(version_seen("2"), "the last valid config stays in force");

    stop.store(true, Ordering::SeqCst);
    while clients.join_next().await.is_some() {}
    assert_eq!(failed.load(Ordering::SeqCst), 0, "no request lost during reloads");
    assert!(ok.load(Ordering::SeqCst) > 20);
    let page = rebound.metrics().await;
    assert_eq!(metric(&page, r#"rebound_config_reloads_total{result="success"}"#), 1.0);
}

#[tokio::test]
async fn sighup_reloads_and_a_bad_file_is_logged_precisely() {
    let provider = FakeProvider::start().await;
    let dir = tempfile::tempdir().unwrap();
    let rebound = ReboundProcess::start(&versioned(&provider.url(), "1").toml(), &[]).await;
    let _ = dir;
    let path = rebound.config_path();
    std::fs::write(
        &path,
        versioned(&provider.url(), "2")
            .route(|r| r.upstream = some("typo"))
            .toml(),
    )
    .unwrap();
    rebound.signal("HUP");
    assert!(
        eventually(Duration::from_secs(5), || rebound
            .logs()
            .contains("configuration reload refused"))
        .await,
        "{}",
        rebound.logs()
    );
    let logs = rebound.logs();
    assert!(
        logs.contains("routes[0].upstream: expected the name of an [upstreams.*] table (fake), found \\\"typo\\\""),
        "{logs}"
    );
    assert!(
        logs.contains("\"trigger\":\"signal\"") || logs.contains("\"trigger\":\"file change\""),
        "{logs}"
    );
    // Still serving on the old config.
    let a = send(
        "GET",
        &format!("{}/fake/echo", rebound.proxy),
        &[("x-fake-key", "hup")],
        "",
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(provider.requests("hup")[0].header("x-config-version"), Some("1"));
}
