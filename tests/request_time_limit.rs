//! `[proxy] request_time_limit`: reads reach the server with `maxTimeMS` at most the limit,
//! so the server stops a long one and answers MaxTimeMSExpired (50) itself — not retried by
//! drivers, unlike the connection close of `reply_timeout`.
//!
//! The stand-in's `maxTimeAlwaysTimeOut` fail point (mongod's, src/mongo/db/curop.cpp
//! checkForInterrupt) fails every operation that carries a `maxTimeMS` with code 50: a read
//! sent without one passes, the same read through a proxy with a limit fails, which shows the
//! limit reached the server.

mod support;

use std::{sync::Arc, time::Duration};

use bson::doc;
use mongoguard::{app::Proxy, config::Config};
use mongoguard_standin::{StandIn, StandInConfig};
use support::raw::RawConn;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_carry_the_limit_to_the_server_writes_do_not() {
    let standin = StandIn::start(StandInConfig::default()).await.unwrap();
    let mut c = Config::for_upstream(&standin.uri()).unwrap();
    c.audit.sink = mongoguard::audit::SinkSpec::None;
    c.admin.listen = None;
    c.proxy.request_time_limit = Duration::from_secs(2);
    let proxy = Proxy::start(Arc::new(c)).await.unwrap();

    let mut direct = RawConn::connect(standin.addr()).await.unwrap();
    let (mut client, _) = RawConn::connect_with_hello(proxy.local_addr()).await;
    let find = doc! {"find": "t", "filter": {}, "$db": "db_x"};
    assert_eq!(
        client.command(find.clone()).await.get_f64("ok").unwrap(),
        1.0
    );

    let fp = direct
        .command(
            doc! {"configureFailPoint": "maxTimeAlwaysTimeOut", "mode": "alwaysOn", "$db": "admin"},
        )
        .await;
    assert_eq!(fp.get_f64("ok").unwrap(), 1.0, "{fp}");
    // Sent as the client wrote it (no maxTimeMS), the read would pass:
    assert_eq!(
        direct.command(find.clone()).await.get_f64("ok").unwrap(),
        1.0
    );
    // Through mongoguard it carries maxTimeMS, and the server stops it.
    let reply = client.command(find).await;
    assert_eq!(reply.get_i32("code").unwrap(), 50, "{reply}");
    // A client limit already below mongoguard's is kept (still a maxTimeMS: 50 too).
    let own = client
        .command(doc! {"count": "t", "maxTimeMS": 100, "$db": "db_x"})
        .await;
    assert_eq!(own.get_i32("code").unwrap(), 50, "{own}");
    // A write is sent as written: no maxTimeMS, so it passes.
    let ins = client
        .command(doc! {"insert": "t", "documents": [{"_id": 1}], "$db": "db_x"})
        .await;
    assert_eq!(ins.get_f64("ok").unwrap(), 1.0, "{ins}");
    assert!(proxy
        .metrics()
        .encode()
        .contains("mongoguard_request_time_limited_total 2"));
    direct
        .command(doc! {"configureFailPoint": "maxTimeAlwaysTimeOut", "mode": "off", "$db": "admin"})
        .await;
    proxy.shutdown().await;
}
