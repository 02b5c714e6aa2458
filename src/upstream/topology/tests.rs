//! Selection, failover and discovery of the topology, without sockets.

use std::{sync::Arc, time::Duration};

use super::*;
use crate::upstream::{HelloFacts, Host, Role, UpstreamUri};

fn facts(role: Role, election: u8) -> Arc<HelloFacts> {
    let mut f = HelloFacts::from_reply(&bson::rawdoc! {"ok": 1, "maxWireVersion": 21}).unwrap();
    f.role = role;
    f.election_id = Some([election; 12]);
    Arc::new(f)
}

fn host(p: u16) -> Host {
    Host {
        name: "h".into(),
        port: p,
    }
}

#[tokio::test]
async fn replica_set_selection_follows_roles() {
    let uri: UpstreamUri = "mongodb://h:1,h:2,h:3/?replicaSet=rs".parse().unwrap();
    let t = Topology::from_uri(&uri);
    let short = Duration::from_millis(20);
    assert!(t.select(ReadPref::Primary, short).await.is_err());
    t.observe(&host(1), &facts(Role::Primary, 1));
    t.observe(&host(2), &facts(Role::Secondary, 0));
    assert_eq!(t.select(ReadPref::Primary, short).await.unwrap(), host(1));
    assert_eq!(t.select(ReadPref::Secondary, short).await.unwrap(), host(2));
    assert_eq!(
        t.select(ReadPref::SecondaryPreferred, short).await.unwrap(),
        host(2)
    );
    // Failover: the old primary is demoted, a request waits, the new one is used.
    t.observe(&host(1), &facts(Role::Secondary, 1));
    let waiter = t.select(ReadPref::Primary, Duration::from_secs(5));
    tokio::pin!(waiter);
    assert!(
        futures::poll!(&mut waiter).is_pending(),
        "no primary is known: the request must wait"
    );
    t.observe(&host(3), &facts(Role::Primary, 2));
    let got = tokio::time::timeout(Duration::from_secs(5), waiter).await;
    assert_eq!(got.unwrap().unwrap(), host(3));
    // A stale primary claim loses to the newer electionId.
    t.observe(&host(1), &facts(Role::Primary, 1));
    assert_eq!(t.snapshot().primary(), Some(&host(3)));
    assert_eq!(
        t.select(ReadPref::PrimaryPreferred, short).await.unwrap(),
        host(3)
    );
}

#[tokio::test]
async fn mongos_list_balances_and_skips_unknown() {
    let uri: UpstreamUri = "mongodb://h:1,h:2".parse().unwrap();
    let t = Topology::from_uri(&uri);
    assert_eq!(t.kind(), &Kind::Mongos);
    t.observe(&host(1), &facts(Role::Mongos, 0));
    t.observe(&host(2), &facts(Role::Mongos, 0));
    let short = Duration::from_millis(20);
    let a = t.select(ReadPref::Primary, short).await.unwrap();
    let b = t.select(ReadPref::Primary, short).await.unwrap();
    assert_ne!(a, b);
    t.mark_unknown(&host(1));
    for _ in 0..4 {
        assert_eq!(t.select(ReadPref::Primary, short).await.unwrap(), host(2));
    }
}

#[tokio::test]
async fn single_server_needs_no_monitoring() {
    let uri: UpstreamUri = "mongodb://h:1".parse().unwrap();
    let t = Topology::from_uri(&uri);
    assert!(!t.is_multi_server());
    let got = t
        .select(ReadPref::Secondary, Duration::from_millis(1))
        .await;
    assert_eq!(got.unwrap(), host(1));
    assert!(t.facts(Duration::from_millis(1)).await.is_none());
    t.observe(&host(1), &facts(Role::Standalone, 0));
    assert_eq!(
        t.facts(Duration::from_millis(1))
            .await
            .unwrap()
            .max_wire_version,
        21
    );
}

#[test]
fn snapshot_discovers_members_once_and_follows_elections() {
    let mut s = Snapshot::default();
    assert!(s.discover(&host(1)));
    assert!(!s.discover(&host(1)), "a known member is not added twice");
    assert_eq!(s.servers.len(), 1);
    assert_eq!(s.servers.first().and_then(|x| x.role), None);
    assert!(s.update(&host(1), Some(Role::Primary), Some([1; 12])));
    assert!(
        !s.update(&host(1), Some(Role::Primary), Some([1; 12])),
        "nothing changed"
    );
    // A host heard from before being listed is added; of two primaries, the newer election wins.
    assert!(s.update(&host(2), Some(Role::Primary), Some([2; 12])));
    assert_eq!(s.servers.len(), 2);
    assert_eq!(s.primary(), Some(&host(2)));
    assert!(s.update(&host(2), None, None));
    assert_eq!(s.primary(), Some(&host(1)));
}

#[tokio::test]
async fn srv_list_adds_and_removes_servers() {
    let mut uri: UpstreamUri = "mongodb+srv://c.x.y/?tls=false".parse().unwrap();
    uri.hosts = vec![host(1)];
    let t = Topology::from_uri(&uri);
    // One SRV host without replicaSet: a mongos list, since the list may grow.
    assert_eq!(t.kind(), &Kind::Mongos);
    let short = Duration::from_millis(20);
    t.observe(&host(1), &facts(Role::Mongos, 0));
    assert_eq!(t.select(ReadPref::Primary, short).await.unwrap(), host(1));
    // Host 2 comes, host 1 goes: only 2 is chosen once its hello is in.
    assert!(t.add_server(&host(2)));
    assert!(!t.add_server(&host(2)), "added twice");
    assert!(t.remove_server(&host(1)));
    assert!(
        t.select(ReadPref::Primary, short).await.is_err(),
        "2 not checked yet"
    );
    t.observe(&host(2), &facts(Role::Mongos, 0));
    // A late hello or failure of the removed host changes nothing.
    t.observe(&host(1), &facts(Role::Mongos, 0));
    t.mark_unknown(&host(1));
    assert_eq!(t.servers(), vec![host(2)]);
    for _ in 0..4 {
        assert_eq!(t.select(ReadPref::Primary, short).await.unwrap(), host(2));
    }
    // Added back, it is a candidate again after its next hello.
    assert!(t.add_server(&host(1)));
    assert!(!t.is_removed(&host(1)));
    t.observe(&host(1), &facts(Role::Mongos, 0));
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(t.select(ReadPref::Primary, short).await.unwrap());
    }
    assert!(seen.contains(&host(1)) && seen.contains(&host(2)));
}
