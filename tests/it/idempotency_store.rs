//! One contract suite, run against both idempotency stores.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rebound::hooks::idempotency::{
    Begin, Completion, Fingerprint, MemoryLimits, MemoryStore, Owner, RecordKey, RedisStore, Store, StoredResponse,
};

use crate::support::redis::RedisServer;

fn response(body: &str) -> StoredResponse {
    StoredResponse {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())].into(),
        body: Bytes::from(body.to_string()),
        age: Duration::ZERO,
    }
}

const LEASE: Duration = Duration::from_millis(300);
const TTL: Duration = Duration::from_secs(60);

fn fp(text: &str) -> Fingerprint {
    Fingerprint::new(text)
}

fn own(text: &str) -> Owner {
    Owner::new(text)
}

async fn contract<S: Store>(s: &S, ns: &str) {
    let k = |name: &str| RecordKey::new(format!("{ns}:{name}"));
    // Absent → claimed; the same owner may claim again (an ambiguous timeout is safe).
    assert_eq!(
        s.begin(&k("a"), &fp("fp1"), &own("owner1"), LEASE).await.unwrap(),
        Begin::Claimed
    );
    assert_eq!(
        s.begin(&k("a"), &fp("fp1"), &own("owner1"), LEASE).await.unwrap(),
        Begin::Claimed
    );
    // Another owner sees it in progress, and whose it is (followers on other replicas ask that
    // owner for its response); another fingerprint is a mismatch, whatever the state.
    assert!(
        matches!(s.begin(&k("a"), &fp("fp1"), &own("owner2"), LEASE).await.unwrap(), Begin::InProgress { lease_left, owner } if lease_left <= LEASE && owner.as_str() == "owner1")
    );
    assert_eq!(
        s.begin(&k("a"), &fp("fp2"), &own("owner2"), LEASE).await.unwrap(),
        Begin::Mismatch
    );
    // Only the owner completes.
    assert!(!s
        .complete(
            &k("a"),
            &fp("fp1"),
            &own("owner2"),
            &Completion::Kept(response("x")),
            TTL
        )
        .await
        .unwrap());
    assert!(s
        .complete(
            &k("a"),
            &fp("fp1"),
            &own("owner1"),
            &Completion::Kept(response("{\"ok\":1}")),
            TTL
        )
        .await
        .unwrap());
    assert_eq!(
        s.begin(&k("a"), &fp("fp1"), &own("owner3"), LEASE).await.unwrap(),
        Begin::Completed(response("{\"ok\":1}"))
    );
    assert_eq!(
        s.begin(&k("a"), &fp("fp2"), &own("owner3"), LEASE).await.unwrap(),
        Begin::Mismatch
    );
    // Completing again is acknowledged for the owner whose completion landed (a retried write
    // whose first reply was lost) but overwrites nothing; a completed record is never released.
    assert!(s
        .complete(&k("a"), &fp("fp1"), &own("owner1"), &Completion::NotKept, TTL)
        .await
        .unwrap());
    assert!(!s
        .complete(&k("a"), &fp("fp1"), &own("owner2"), &Completion::NotKept, TTL)
        .await
        .unwrap());
    assert_eq!(
        s.begin(&k("a"), &fp("fp1"), &own("owner3"), LEASE).await.unwrap(),
        Begin::Completed(response("{\"ok\":1}"))
    );
    assert!(!s.release(&k("a"), &own("owner1")).await.unwrap());

    // A delivered response whose claim is gone (lapsed while the store was unreachable, or the
    // store restarted empty) is recorded: nobody holds the key, and a retry must replay it.
    assert!(s
        .complete(
            &k("gone"),
            &fp("fpg"),
            &own("o1"),
            &Completion::Kept(response("delivered")),
            TTL
        )
        .await
        .unwrap());
    assert_eq!(
        s.begin(&k("gone"), &fp("fpg"), &own("o2"), LEASE).await.unwrap(),
        Begin::Completed(response("delivered"))
    );
    assert_eq!(
        s.begin(&k("gone"), &fp("other"), &own("o2"), LEASE).await.unwrap(),
        Begin::Mismatch
    );

    // Release frees the key for the next claim; only the owner releases.
    assert_eq!(
        s.begin(&k("b"), &fp("fp"), &own("o1"), LEASE).await.unwrap(),
        Begin::Claimed
    );
    assert!(!s.release(&k("b"), &own("o2")).await.unwrap());
    assert!(s.release(&k("b"), &own("o1")).await.unwrap());
    assert_eq!(
        s.begin(&k("b"), &fp("fp"), &own("o2"), LEASE).await.unwrap(),
        Begin::Claimed
    );

    // Not kept.
    assert_eq!(
        s.begin(&k("c"), &fp("fp"), &own("o1"), LEASE).await.unwrap(),
        Begin::Claimed
    );
    assert!(s
        .complete(&k("c"), &fp("fp"), &own("o1"), &Completion::NotKept, TTL)
        .await
        .unwrap());
    assert_eq!(
        s.begin(&k("c"), &fp("fp"), &own("o2"), LEASE).await.unwrap(),
        Begin::NotKept
    );

    // A lease that is not renewed lapses; a renewed one holds; a stale owner cannot renew.
    assert_eq!(
        s.begin(&k("d"), &fp("fp"), &own("o1"), LEASE).await.unwrap(),
        Begin::Claimed
    );
    assert_eq!(
        s.begin(&k("e"), &fp("fp"), &own("o1"), LEASE).await.unwrap(),
        Begin::Claimed
    );
    for _ in 0..4 {
        tokio::time::sleep(LEASE / 3).await;
        assert!(s.renew(&k("e"), &own("o1"), LEASE).await.unwrap());
        assert!(!s.renew(&k("e"), &own("o2"), LEASE).await.unwrap());
    }
    assert_eq!(
        s.begin(&k("d"), &fp("fp"), &own("o2"), LEASE).await.unwrap(),
        Begin::Claimed,
        "lapsed"
    );
    assert!(
        matches!(
            s.begin(&k("e"), &fp("fp"), &own("o2"), LEASE).await.unwrap(),
            Begin::InProgress { .. }
        ),
        "renewed"
    );
    // The stale owner of d cannot complete over the new owner.
    assert!(!s
        .complete(
            &k("d"),
            &fp("fp"),
            &own("o1"),
            &Completion::Kept(response("stale")),
            TTL
        )
        .await
        .unwrap());
    assert!(s
        .complete(
            &k("d"),
            &fp("fp"),
            &own("o2"),
            &Completion::Kept(response("fresh")),
            TTL
        )
        .await
        .unwrap());
    assert_eq!(
        s.begin(&k("d"), &fp("fp"), &own("o3"), LEASE).await.unwrap(),
        Begin::Completed(response("fresh"))
    );

    // Binary bodies survive.
    let bin = StoredResponse {
        status: 201,
        headers: Vec::new().into(),
        body: Bytes::from(vec![0u8, 159, 146, 150, 255]),
        age: Duration::ZERO,
    };
    assert_eq!(
        s.begin(&k("f"), &fp("fp"), &own("o1"), LEASE).await.unwrap(),
        Begin::Claimed
    );
    assert!(s
        .complete(&k("f"), &fp("fp"), &own("o1"), &Completion::Kept(bin.clone()), TTL)
        .await
        .unwrap());
    assert_eq!(
        s.begin(&k("f"), &fp("fp"), &own("o2"), LEASE).await.unwrap(),
        Begin::Completed(bin)
    );
}

async fn concurrent_claims<S: Store>(s: Arc<S>, ns: &str) {
    let mut set = tokio::task::JoinSet::new();
    for i in 0..50 {
        let s = s.clone();
        let key = RecordKey::new(format!("{ns}:race"));
        set.spawn(async move {
            s.begin(&key, &fp("fp"), &own(&format!("owner{i}")), Duration::from_secs(5))
                .await
                .unwrap()
        });
    }
    let mut claimed = 0;
    while let Some(r) = set.join_next().await {
        if r.unwrap() == Begin::Claimed {
            claimed += 1;
        }
    }
    assert_eq!(claimed, 1, "exactly one winner");
}

#[tokio::test]
async fn memory_store_contract() {
    let s = MemoryStore::new(MemoryLimits::default());
    contract(&s, "m").await;
    concurrent_claims(Arc::new(s), "m").await;
}

#[tokio::test]
async fn redis_store_contract() {
    let redis = RedisServer::start();
    let handle = crate::support::sidecar::redis_handle(&redis.url()).await;
    let s = RedisStore::new(handle);
    contract(&s, "r").await;
    concurrent_claims(Arc::new(s), "r").await;
}

#[tokio::test]
async fn memory_store_stays_within_its_bounds() {
    let s = MemoryStore::new(MemoryLimits {
        max_entries: 100,
        max_bytes: 1 << 20,
    });
    for i in 0..1000 {
        let key = RecordKey::new(format!("k{i}"));
        assert_eq!(s.begin(&key, &fp("fp"), &own("o"), TTL).await.unwrap(), Begin::Claimed);
        assert!(s
            .complete(&key, &fp("fp"), &own("o"), &Completion::Kept(response("body")), TTL)
            .await
            .unwrap());
    }
    assert!(s.len() <= 100, "{}", s.len());
    // The newest records survive eviction.
    assert!(matches!(
        s.begin(&RecordKey::new("k999"), &fp("fp"), &own("o2"), TTL)
            .await
            .unwrap(),
        Begin::Completed(_)
    ));
}

/// The scripts refuse a claim or a renewal that runs after its caller gave up on it (`not_after`
/// on Redis's clock): such a command sat in a frozen Redis's socket buffer and must change nothing.
#[tokio::test]
async fn redis_scripts_refuse_a_claim_or_renewal_that_runs_too_late() {
    let redis = RedisServer::start();
    let client = ::redis::Client::open(redis.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let begin = ::redis::Script::new(include_str!("../../src/redis/scripts/idem_begin_v4.lua"));
    let renew = ::redis::Script::new(include_str!("../../src/redis/scripts/idem_renew_v2.lua"));
    let (secs, micros): (i64, i64) = ::redis::cmd("TIME").query_async(&mut c).await.unwrap();
    let now_ms = secs * 1000 + micros / 1000;

    let late: Vec<String> = begin
        .key("idem:{late}")
        .arg("fp")
        .arg("o1")
        .arg(30_000)
        .arg(now_ms - 1)
        .invoke_async(&mut c)
        .await
        .unwrap();
    assert_eq!(late, vec!["late".to_string()]);
    let exists: i64 = ::redis::cmd("EXISTS")
        .arg("idem:{late}")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(exists, 0, "a late claim leaves nothing behind");

    // In time: claimed. A late renewal does not extend the lease; one in time does.
    let claimed: Vec<String> = begin
        .key("idem:{late}")
        .arg("fp")
        .arg("o1")
        .arg(30_000)
        .arg(now_ms + 60_000)
        .invoke_async(&mut c)
        .await
        .unwrap();
    assert_eq!(claimed, vec!["claimed".to_string()]);
    let _: () = ::redis::cmd("PEXPIRE")
        .arg("idem:{late}")
        .arg(5_000)
        .query_async(&mut c)
        .await
        .unwrap();
    let n: i64 = renew
        .key("idem:{late}")
        .arg("o1")
        .arg(30_000)
        .arg(now_ms - 1)
        .invoke_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, -1);
    let pttl: i64 = ::redis::cmd("PTTL")
        .arg("idem:{late}")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(pttl <= 5_000, "the late renewal changed nothing: {pttl}");
    let n: i64 = renew
        .key("idem:{late}")
        .arg("o1")
        .arg(30_000)
        .arg(0)
        .invoke_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_contract_on_a_cluster() {
    let _one_at_a_time = crate::support::redis_cluster::TOPOLOGY.lock().await;
    let cluster = crate::support::redis_cluster::RedisCluster::start(3, 0);
    let handle = crate::support::sidecar::redis_handle_for(
        rebound::hooks::config::RedisConfig {
            command_timeout: Duration::from_millis(500),
            ..rebound::hooks::config::RedisConfig::standalone("")
        }
        .with_topology(rebound::hooks::config::RedisTopology::Cluster { seeds: cluster.seeds() }),
    )
    .await;
    let s = RedisStore::new(handle);
    // Namespaces spread over the three masters (each record is one slot of its own).
    for ns in ["c1", "c2", "c3", "c4"] {
        contract(&s, ns).await;
    }
    concurrent_claims(Arc::new(s), "c").await;
}

/// Owner liveness: a dead replica's claim is taken over only by compare-and-set on its
/// owner and fingerprint, and never while it is younger than `liveness` (a replica's first claims
/// may land before its first heartbeat: chaos found another replica taking them over).
#[tokio::test]
async fn a_claim_is_taken_over_only_when_old_enough_and_still_the_dead_owners() {
    use rebound::hooks::idempotency::{DeadOwner, Succession, TakenOver};
    /// `owner` takes over `dead`'s claim, with the test's lease, unless it is younger than `liveness`.
    fn heir<'a>(dead: &'a Owner, owner: &'a Owner, liveness: Duration) -> Succession<'a> {
        Succession {
            dead: DeadOwner(dead),
            owner,
            lease: TTL,
            liveness,
        }
    }
    let redis = RedisServer::start();
    let handle = crate::support::sidecar::redis_handle(&redis.url()).await;
    let s = RedisStore::new(handle);
    let key = RecordKey::new("t:a");
    let dead = own("0123456789abcdef.0000000000000001");
    let liveness = Duration::from_millis(1500);
    assert_eq!(s.begin(&key, &fp("fp"), &dead, TTL).await.unwrap(), Begin::Claimed);
    // Just claimed: too young, whoever asks.
    assert_eq!(
        s.take_over(&key, &fp("fp"), heir(&dead, &own("new.1"), liveness))
            .await
            .unwrap(),
        TakenOver::TooYoung
    );
    // Aged past liveness (its claim time moved back on Redis's clock).
    let client = ::redis::Client::open(redis.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let at: i64 = ::redis::cmd("HGET")
        .arg("rebound:t:a")
        .arg("at")
        .query_async(&mut c)
        .await
        .unwrap();
    let _: () = ::redis::cmd("HSET")
        .arg("rebound:t:a")
        .arg("at")
        .arg(at - 2000)
        .query_async(&mut c)
        .await
        .unwrap();
    // Another fingerprint, or an owner that no longer holds it: changed, nothing written.
    assert_eq!(
        s.take_over(&key, &fp("other"), heir(&dead, &own("new.1"), liveness))
            .await
            .unwrap(),
        TakenOver::Changed
    );
    assert_eq!(
        s.take_over(
            &key,
            &fp("fp"),
            heir(&own("fedcba9876543210.1"), &own("new.1"), liveness)
        )
        .await
        .unwrap(),
        TakenOver::Changed
    );
    assert!(
        matches!(s.begin(&key, &fp("fp"), &own("x"), TTL).await.unwrap(), Begin::InProgress { owner, .. } if owner == dead)
    );
    // The dead owner's claim, old enough: taken over once; the new owner holds it, young again.
    assert_eq!(
        s.take_over(&key, &fp("fp"), heir(&dead, &own("new.1"), liveness))
            .await
            .unwrap(),
        TakenOver::Yes
    );
    assert_eq!(
        s.take_over(&key, &fp("fp"), heir(&dead, &own("new.2"), liveness))
            .await
            .unwrap(),
        TakenOver::Changed
    );
    assert!(
        matches!(s.begin(&key, &fp("fp"), &own("x"), TTL).await.unwrap(), Begin::InProgress { owner, .. } if owner.as_str() == "new.1")
    );
    // The dead owner can no longer complete or renew it; the new one can.
    let done = Completion::Kept(response("{}"));
    assert!(!s.complete(&key, &fp("fp"), &dead, &done, TTL).await.unwrap());
    assert!(!s.renew(&key, &dead, TTL).await.unwrap());
    assert!(s.complete(&key, &fp("fp"), &own("new.1"), &done, TTL).await.unwrap());
    assert!(matches!(
        s.begin(&key, &fp("fp"), &own("x"), TTL).await.unwrap(),
        Begin::Completed(_)
    ));
}
