//! Zero-downtime restart: with `[proxy] reuse_port = true` a second mongoguard binds the
//! same port beside one that is draining. New connections are served throughout; the draining
//! one finishes its in-flight requests. Without `reuse_port`, a second instance on a taken port
//! fails to start (no silent sharing).

mod support;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use bson::doc;
use mongoguard::{
    app::{Proxy, ProxyHandle},
    config::Config,
};
use mongoguard_standin::{StandIn, StandInConfig};
use support::raw::RawConn;

const BOUND: Duration = Duration::from_secs(20);

fn config(standin: &StandIn, listen: SocketAddr, reuse_port: bool) -> Arc<Config> {
    let mut c = Config::for_upstream(&standin.uri()).unwrap();
    c.audit.sink = mongoguard::audit::SinkSpec::None;
    c.admin.listen = None;
    c.proxy.listen = listen;
    c.proxy.reuse_port = reuse_port;
    Arc::new(c)
}

fn ok(reply: &bson::Document) -> bool {
    matches!(reply.get("ok"), Some(bson::Bson::Double(d)) if *d == 1.0)
        || matches!(reply.get("ok"), Some(bson::Bson::Int32(1)))
}

async fn ping_on_new_connection(addr: SocketAddr) -> Result<(), String> {
    let mut c = RawConn::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let reply = tokio::time::timeout(BOUND, c.command(doc! {"ping": 1, "$db": "admin"}))
        .await
        .map_err(|_| "no reply".to_owned())?;
    ok(&reply).then_some(()).ok_or(format!("{reply}"))
}

/// A connection accepted by `proxy` (the kernel spreads connections over the processes that
/// share the port: connect until one lands there).
async fn connection_on(proxy: &ProxyHandle, addr: SocketAddr) -> RawConn {
    for _ in 0..200 {
        let before = proxy.stats().accepted.get();
        let mut c = RawConn::connect(addr).await.unwrap();
        assert!(ok(&c.command(doc! {"ping": 1, "$db": "admin"}).await));
        if proxy.stats().accepted.get() > before {
            return c;
        }
    }
    panic!("no connection reached the first process in 200 tries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_takes_over_while_the_first_drains() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let old = Proxy::start(config(&standin, port, true)).await.unwrap();
    let addr = old.local_addr();

    // Without reuse_port the port is taken: a misconfigured second instance fails loudly.
    let taken = Proxy::start(config(&standin, addr, false)).await;
    assert!(
        taken.is_err(),
        "a second instance without reuse_port must not bind"
    );

    let new = Proxy::start(config(&standin, addr, true)).await.unwrap();
    assert_eq!(new.local_addr(), addr);
    let (old_stats, new_stats) = (old.stats(), new.stats());

    // An in-flight request on the old process: the server holds its reply 700 ms.
    let mut in_flight = connection_on(&old, addr).await;
    let mut direct = RawConn::connect(standin.addr()).await.unwrap();
    assert!(ok(&direct
        .command(doc! {
            "configureFailPoint": "failCommand", "mode": {"times": 1},
            "data": {"failCommands": ["find"], "blockConnection": true, "blockTimeMS": 700},
            "$db": "admin",
        })
        .await));
    let request = in_flight
        .send(0, &doc! {"find": "t", "filter": {"_id": 1}, "$db": "app"})
        .await;
    // SIGTERM of the old process (what run_until_signal does on the signal).
    let draining = tokio::spawn(old.shutdown());

    // New connections keep being served, by the new process once the old one stopped
    // accepting.
    let served_before = new_stats.accepted.get();
    for i in 0..100 {
        ping_on_new_connection(addr)
            .await
            .unwrap_or_else(|e| panic!("connection {i} during the takeover failed: {e}"));
    }
    assert!(new_stats.accepted.get() > served_before);

    // The in-flight request completed on the old process, which then exited.
    let reply = tokio::time::timeout(BOUND, in_flight.read())
        .await
        .expect("in-flight reply");
    assert_eq!(reply.response_to, request);
    assert!(ok(&reply.body), "{:?}", reply.body);
    tokio::time::timeout(BOUND, draining)
        .await
        .expect("the old process drains in time")
        .unwrap();
    let accepted_by_old = old_stats.accepted.get();
    for _ in 0..20 {
        ping_on_new_connection(addr).await.unwrap();
    }
    assert_eq!(
        old_stats.accepted.get(),
        accepted_by_old,
        "the old one stopped accepting"
    );
    new.shutdown().await;
}
