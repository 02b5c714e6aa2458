//! The demo: mongoguard in front of the embedded stand-in upstream (an in-memory imitation of
//! mongod for tests and demos, not a database), with the standard policy. It prints the
//! connection string, walks through a few allowed and blocked commands over the wire, then
//! keeps serving until Ctrl-C (or exits with `--once`).
//!
//! ```sh
//! cargo run --release --example demo
//! cargo run --release --example demo -- --listen 127.0.0.1:0 --once
//! ```
//!
//! An example, not a subcommand of the `mongoguard` binary: the stand-in is a dev-dependency
//! of the crate, so it is built for examples and tests and never linked into the product.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context as _;
use bson::{rawdoc, RawDocumentBuf};
use clap::Parser;
use futures::StreamExt;
use mongoguard::{
    app::{Proxy, ProxyHandle},
    config::Config,
    wire::{builder::MsgBuilder, MessageCodec, OpMsg},
};
use mongoguard_standin::{StandIn, StandInConfig};
use tokio::{io::AsyncWriteExt, net::TcpStream};
use tokio_util::codec::FramedRead;

/// mongoguard demo: the proxy in front of an embedded stand-in upstream.
#[derive(Parser)]
struct Args {
    /// Where mongoguard listens (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:27017")]
    listen: SocketAddr,
    /// Where the stand-in upstream listens (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    upstream_listen: SocketAddr,
    /// A policy file (default: the built-in standard profile).
    #[arg(long)]
    policy: Option<std::path::PathBuf>,
    /// Run the walkthrough and exit instead of serving until Ctrl-C.
    #[arg(long)]
    once: bool,
}

struct Client {
    read: FramedRead<tokio::net::tcp::OwnedReadHalf, MessageCodec>,
    write: tokio::net::tcp::OwnedWriteHalf,
    next_id: i32,
}

impl Client {
    async fn connect(addr: SocketAddr) -> anyhow::Result<Client> {
        let (r, w) = TcpStream::connect(addr).await?.into_split();
        Ok(Client {
            read: FramedRead::new(r, MessageCodec::default()),
            write: w,
            next_id: 1,
        })
    }

    async fn run(&mut self, body: RawDocumentBuf) -> anyhow::Result<RawDocumentBuf> {
        self.next_id += 1;
        self.write
            .write_all(&MsgBuilder::new(body).encode(self.next_id, 0))
            .await?;
        let frame = tokio::time::timeout(Duration::from_secs(10), self.read.next())
            .await
            .context("no reply")?
            .context("connection closed")??;
        Ok(OpMsg::parse(frame.bytes())?.body().to_owned())
    }
}

fn summary(reply: &RawDocumentBuf) -> String {
    match reply.get_str("errmsg") {
        Ok(msg) => format!(
            "refused, code {} {}: {msg}",
            reply.get_i32("code").unwrap_or_default(),
            reply.get_str("codeName").unwrap_or_default()
        ),
        Err(_) => match reply.get_i32("n") {
            Ok(n) => format!("ok, n = {n}"),
            Err(_) => "ok".to_owned(),
        },
    }
}

async fn walkthrough(proxy: &ProxyHandle) -> anyhow::Result<()> {
    let mut c = Client::connect(proxy.local_addr()).await?;
    let steps: Vec<(&str, RawDocumentBuf)> = vec![
        (
            "insert three documents",
            rawdoc! {"insert": "users", "documents": [{"_id": 1, "name": "ada", "age": 36}, {"_id": 2, "name": "bob", "age": 41}, {"_id": 3, "name": "cy", "age": 29}], "$db": "db_demo"},
        ),
        (
            "find by _id",
            rawdoc! {"find": "users", "filter": {"_id": 2}, "$db": "db_demo"},
        ),
        (
            "update with multi and an empty filter (W001)",
            rawdoc! {"update": "users", "updates": [{"q": {}, "u": {"$set": {"age": 0}}, "multi": true}], "$db": "db_demo"},
        ),
        (
            "delete everything (W003)",
            rawdoc! {"delete": "users", "deletes": [{"q": {"$or": [{"age": 1}, {"_id": {"$exists": true}}]}, "limit": 0.0}], "$db": "db_demo"},
        ),
        (
            "write into admin (W005)",
            rawdoc! {"insert": "x", "documents": [{"a": 1}], "$db": "admin"},
        ),
        (
            "a write concern with j:false (W006)",
            rawdoc! {"insert": "users", "documents": [{"_id": 4}], "writeConcern": {"j": false}, "$db": "db_demo"},
        ),
        (
            "find with $ne (Q001: warns, forwarded)",
            rawdoc! {"find": "users", "filter": {"age": {"$ne": 41}}, "$db": "db_demo"},
        ),
        (
            "count what is left",
            rawdoc! {"count": "users", "$db": "db_demo"},
        ),
    ];
    for (what, cmd) in steps {
        println!("* {what}");
        let reply = c.run(cmd).await?;
        proxy.audit().flush().await;
        println!("  -> {}", summary(&reply));
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let standin = StandIn::start(StandInConfig {
        listen: args.upstream_listen,
        ..Default::default()
    })
    .await
    .context("starting the stand-in upstream")?;
    let mut config = Config::for_upstream(&standin.uri())?;
    config.proxy.listen = args.listen;
    config.policy.file = args.policy;
    let proxy = Proxy::start(Arc::new(config))
        .await
        .context("starting mongoguard")?;
    println!("mongoguard demo");
    println!("  upstream: embedded stand-in at {} (an in-memory test imitation of mongod, not a database)", standin.uri());
    println!(
        "  connect:  mongodb://{}/?directConnection=true",
        proxy.local_addr()
    );
    println!("  policy:   {}", proxy.policy().source());
    if let Some(admin) = proxy.admin_addr() {
        println!("  admin:    http://{admin}/ (metrics at /metrics)");
    }
    println!();
    println!("walkthrough (violation records are the JSON lines on stdout):");
    walkthrough(&proxy).await?;
    if args.once {
        proxy.shutdown().await;
        standin.shutdown().await;
        return Ok(());
    }
    println!();
    println!(
        "serving; try: mongosh \"mongodb://{}/?directConnection=true\"   (Ctrl-C stops)",
        proxy.local_addr()
    );
    proxy.run_until_signal().await?;
    standin.shutdown().await;
    Ok(())
}
