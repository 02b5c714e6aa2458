//! The mongoguard command line. The only place `anyhow` is used.

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::ExitCode,
    sync::Arc,
    time::Duration,
};

use anyhow::Context as _;
use clap::{Args, CommandFactory, Parser, Subcommand};
use mongoguard::{
    app::{ConfigSource, EarlyStop, Proxy, ShutdownSignals},
    check::{Checker, Format},
    config::{Config, LogFormat},
    logging::LogGuard,
    policy::{Policy, RULES},
};

/// The allocator of the whole process: jemalloc, with its background thread returning freed
/// memory to the system. With glibc's malloc the memory of closed connections stays resident
/// (RSS stayed at its peak after 5,000 idle clients left). Measurements: docs/memory.md.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// `mongoguard --version`: the package version and the git commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("MONGOGUARD_GIT_COMMIT"),
    ")"
);

/// `mongoguard --help` (long form) before the options, man-page style.
const LONG_ABOUT: &str = "\
A MongoDB wire-protocol guard proxy.

DESCRIPTION
    Applications connect to mongoguard instead of mongod or mongos. It decodes every message,
    enforces the MongoDB development standards (the policy), forwards what is allowed as the
    client's original bytes, answers what is blocked with a MongoDB error (code 65001), and
    records every violation as a JSON line. Without a subcommand, mongoguard runs the proxy.

MODES
    passthrough (default)  one upstream connection per client; the client's own
                           authentication goes through to mongod.
    pooled                 mongoguard authenticates clients itself (SCRAM, users file) and
                           runs their requests on a few shared, pre-authenticated upstream
                           connections.
    Policy mode: a policy with mode = \"audit\" turns every block into a warning.

CONFIGURATION
    A TOML file given with --config (no file is read without it); --listen, --upstream,
    --policy, --log-format and --log-level override its values. Unknown keys are errors.
    `mongoguard --check-config -c FILE` validates a file and prints the effective
    configuration as TOML (defaults filled in, secrets shown as \"***\"). Sections:
    [proxy] [upstream] [upstream.identities.NAME] [pool] [auth] [tls] [log] [policy] [audit]
    [admin] [plan] [allowlist] (every key: mongoguard.example.toml and the README, \"Configuration\").";

/// `mongoguard --help` (long form) after the options.
const AFTER_LONG_HELP: &str = "\
SIGNALS
    SIGHUP           reload the policy file (validated first; an invalid file keeps the
                     old policy; a built-in profile has nothing to reload), the allowlist
                     file ([allowlist] mode = \"enforce\"; an invalid file keeps the old
                     allowlist), the users file (pooled mode), the TLS certificate, key
                     and client CA ([tls]; an invalid set keeps the one in force), the
                     upstream URI's tlsCAFile and tlsCertificateKeyFile (likewise), and
                     reopen the audit file sinks (logrotate). Never terminates the process.
                     The policy file is also reloaded when it changes on disk. The
                     configuration file itself is not applied: settings changed in it are
                     logged as needing a restart (and listed by GET /config).
    SIGTERM, SIGINT  graceful drain: /readyz says 503 at once; after [proxy] shutdown_delay
                     (0 by default; a second signal cuts it short) stop accepting, let
                     in-flight requests finish for up to [proxy] drain_timeout (30s by
                     default), then close what is left; the audit streams are written out
                     before exit. During the start: exit at once, status 0.

FILES
    /etc/mongoguard/mongoguard.toml  configuration, by convention (pass it with --config)
    /etc/mongoguard/policy.toml      a policy file ([policy] file or --policy)
    /etc/mongoguard/users.toml       pooled mode's users file ([auth] users_file)

EXIT STATUS
    0  the proxy stopped cleanly after SIGTERM/SIGINT; a command succeeded
    1  `mongoguard check`: a blocking rule fired
    2  invalid configuration, policy or input; the listener could not be bound; a usage
       error

EXAMPLES
    mongoguard --listen 127.0.0.1:27017 --upstream mongodb://db1.internal:27017
    mongoguard --config /etc/mongoguard/mongoguard.toml
    mongoguard --check-config --config mongoguard.toml
    mongoguard check --policy policy.toml mongod.log
    mongoguard policy show strict
    mongoguard completions bash > /etc/bash_completion.d/mongoguard
    mongoguard man > mongoguard.1";

/// A MongoDB wire-protocol guard proxy.
#[derive(Debug, Parser)]
#[command(
    name = "mongoguard",
    version = VERSION,
    about,
    long_about = LONG_ABOUT,
    after_long_help = AFTER_LONG_HELP,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the proxy (the default).
    Run(RunArgs),
    /// Evaluate captured commands against a policy, without the proxy: mongod JSON log lines
    /// (4.4+), profiler documents exported from system.profile, or JSON lines of commands.
    /// Exits 1 when a blocking rule fires, 2 on bad input.
    Check(CheckArgs),
    /// Policy files.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// The users file of pooled mode (SCRAM secrets, never passwords).
    #[command(subcommand)]
    Users(UsersCommand),
    /// Print a shell completion script to standard output.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to standard output, e.g. `mongoguard man | man -l -`.
    Man,
    /// Operator actions on a running mongoguard through its admin API (like PgBouncer's
    /// console): list connections, kill one, pause / resume, reset the admin statistics.
    Admin(AdminArgs),
}

#[derive(Debug, Args)]
struct AdminArgs {
    /// The admin listener's address.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9216")]
    admin: String,
    /// A file holding the admin token (`[admin] token_file`); without it, no token is sent.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    #[command(subcommand)]
    action: AdminAction,
}

#[derive(Debug, Subcommand)]
enum AdminAction {
    /// Every live client connection (GET /connections).
    Connections,
    /// Close one client connection (POST /connections/ID/kill).
    Kill {
        /// The connection's id, from `connections`.
        id: u64,
    },
    /// Hold new requests (POST /pause).
    Pause,
    /// Let them go (POST /resume).
    Resume,
    /// Empty the admin views' statistics (POST /stats/reset).
    ResetStats,
    /// No new sessions or checkouts on one upstream server (POST /servers/HOST:PORT/drain).
    Drain {
        /// The server, host:port as in `/pool`.
        server: String,
    },
    /// Undo `drain` (POST /servers/HOST:PORT/enable).
    Enable {
        /// The server, host:port.
        server: String,
    },
}

#[derive(Debug, Subcommand)]
enum UsersCommand {
    /// Derive SCRAM-SHA-256 and SCRAM-SHA-1 secrets for NAME and append them to the users
    /// file (created with mode 0600 if missing). The password is read from the first line of
    /// standard input, so it never appears in the process list or shell history.
    Add {
        /// The users file.
        #[arg(long, value_name = "FILE")]
        file: PathBuf,
        /// Authentication database.
        #[arg(long, default_value = "admin")]
        db: String,
        /// User name.
        name: String,
    },
}

#[derive(Debug, Clone, Args)]
struct RunArgs {
    /// Configuration file (TOML). Flags below override its values.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:27017.
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// Upstream mongod/mongos, e.g. mongodb://127.0.0.1:27018.
    #[arg(long, value_name = "URI")]
    upstream: Option<String>,
    /// Admin HTTP listener (metrics, health, status page), e.g. 127.0.0.1:9216, or "off".
    #[arg(long, value_name = "ADDR|off")]
    admin_listen: Option<String>,
    /// Policy file (default: the built-in standard profile).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
    /// Log filter, e.g. info, debug, mongoguard=debug.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
    /// Validate the configuration, print it, and exit.
    #[arg(long)]
    check_config: bool,
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// Policy file, or a built-in profile name: standard, strict, audit (default: standard).
    #[arg(long, value_name = "FILE|PROFILE")]
    policy: Option<PathBuf>,
    /// Report format.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Database for bare commands that carry no $db.
    #[arg(long, default_value = "test")]
    db: String,
    /// Input files ("-" for standard input).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Check a policy file without running the proxy; print its effective rules.
    Validate {
        /// The policy file.
        file: PathBuf,
    },
    /// Print the rules of a policy (a file, or a built-in profile name).
    Show {
        /// A file, or standard / strict / audit.
        #[arg(default_value = "standard")]
        policy: String,
    },
}

fn load_config(args: &RunArgs) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(listen) = args.listen {
        config.proxy.listen = listen;
    }
    if let Some(uri) = &args.upstream {
        config.upstream.uri = uri.parse().context("--upstream")?;
    }
    if let Some(policy) = &args.policy {
        config.policy.file = Some(policy.clone());
    }
    if let Some(admin) = &args.admin_listen {
        config.admin.listen = match admin.trim() {
            "" | "off" => None,
            a => Some(a.parse().context("--admin-listen")?),
        };
    }
    if let Some(format) = args.log_format {
        config.log.format = format;
    }
    if let Some(level) = &args.log_level {
        config.log.level = level.clone();
    }
    config.validate()?;
    Ok(config)
}

/// Installs the log: a bounded, lossy queue to standard error drained by its own thread, so
/// a slow or stuck standard error never holds a request (see `mongoguard::logging`).
fn init_logging(config: &Config) -> anyhow::Result<LogGuard> {
    Ok(mongoguard::logging::init(
        &config.log.level,
        config.log.format,
    )?)
}

/// How long the runtime's own shutdown waits for tasks still running after the proxy
/// stopped (a blocking write to a stuck sink is left behind rather than waited for).
const RUNTIME_SHUTDOWN_BOUND: Duration = Duration::from_secs(1);

/// How long exit waits for queued log lines to reach standard error.
const LOG_FLUSH_BOUND: Duration = Duration::from_secs(2);

fn run(args: &RunArgs) -> anyhow::Result<ExitCode> {
    if args.check_config {
        let config = load_config(args)?;
        // The effective configuration (defaults filled in, command-line overrides applied)
        // as TOML mongoguard reads back, secrets replaced by "***".
        let text = toml::to_string(&config).context("printing the configuration")?;
        println!("# mongoguard: configuration OK; effective values, secrets masked\n{text}");
        return Ok(ExitCode::SUCCESS);
    }
    // Before the runtime exists (its build starts every worker thread): a SIGTERM or SIGINT
    // from here on stops the process cleanly instead of killing it (or, as PID 1 in a
    // container, being dropped by the kernel). Read once the runtime's handlers are in.
    let early = EarlyStop::install();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    // First of all, before the configuration is read (a `--config <(...)` pipe can take
    // seconds to be written): a SIGTERM or SIGINT during the start (that read, an upstream or
    // name server that does not answer, a slow policy or allowlist) stops the process
    // cleanly, with status 0 like any requested stop (nothing was served yet). Without the
    // handlers it killed the process outright, and as PID 1 in a container the kernel
    // dropped it.
    let mut signals = {
        let _in_runtime = runtime.enter();
        ShutdownSignals::install().context("installing the signal handlers")?
    };
    if early.requested() {
        // Nothing read, nothing served; the log does not exist yet.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "mongoguard: stop requested during the start; exiting before serving"
        );
        runtime.shutdown_timeout(RUNTIME_SHUTDOWN_BOUND);
        return Ok(ExitCode::SUCCESS);
    }
    let config = load_config(args)?;
    let log = init_logging(&config)?;
    let result = runtime.block_on(async move {
        // Read again at SIGHUP, to say which changed settings need a restart: a regular file
        // only. A `--config <(...)` pipe was read once; opening it again would block the
        // reload task for good (no writer any more), and every later SIGHUP with it.
        let again = args.clone();
        let regular = |p: &std::path::Path| std::fs::metadata(p).is_ok_and(|m| m.is_file());
        let source = args
            .config
            .clone()
            .filter(|p| regular(p))
            .map(|path| -> ConfigSource {
                Arc::new(move || {
                    if !regular(&path) {
                        return Err(format!("{}: not a regular file", path.display()));
                    }
                    load_config(&again).map_err(|e| format!("{e:#}"))
                })
            });
        let proxy = tokio::select! {
            // A stop received before the start (while the configuration was read) wins.
            biased;
            () = signals.recv() => {
                tracing::info!("stop requested during the start; exiting before serving");
                return anyhow::Ok(());
            }
            started = Proxy::start_from(Arc::new(config), source) => started?,
        };
        proxy.run_until(&mut signals).await;
        anyhow::Ok(())
    });
    // Dropping the runtime would wait without bound for blocking writes (a stuck sink).
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_BOUND);
    log.flush(LOG_FLUSH_BOUND);
    result?;
    Ok(ExitCode::SUCCESS)
}

/// A policy file or a built-in profile name (`PolicySource::resolve`).
fn load_policy(file: Option<&PathBuf>) -> anyhow::Result<Policy> {
    Ok(match file {
        Some(name) => mongoguard::policy::PolicySource::resolve(name)?.load()?,
        None => Policy::standard(),
    })
}

fn check(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let policy = load_policy(args.policy.as_ref())?;
    let mut checker = Checker::default();
    for file in &args.files {
        let reader: Box<dyn BufRead> = if file.as_os_str() == "-" {
            Box::new(BufReader::new(std::io::stdin()))
        } else {
            let f =
                std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
            Box::new(BufReader::new(f))
        };
        let source = file.display().to_string();
        for (i, line) in reader.lines().enumerate() {
            let line = line.with_context(|| format!("reading {}", file.display()))?;
            checker.line_at(&policy, &line, &args.db, &source, i as u64 + 1);
        }
    }
    checker.finish(&policy);
    let report = checker.report();
    print!("{}", report.render(args.format));
    if args.format == Format::Json {
        println!();
    }
    Ok(ExitCode::from(report.exit_code()))
}

fn print_rules(policy: &Policy) {
    println!("mode: {}", policy.mode().as_str());
    for rule in RULES.iter() {
        let note = if rule.scope == mongoguard::policy::Scope::Connection {
            "  (per application: reported periodically, never blocks)"
        } else if rule.implemented {
            ""
        } else {
            "  (not implemented yet: never fires)"
        };
        println!(
            "{} {:<32} {:<5}{note}",
            rule.code,
            rule.name,
            policy.action(rule.id).as_str()
        );
    }
}

fn policy_command(cmd: &PolicyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PolicyCommand::Validate { file } => {
            let policy = Policy::load(file)?;
            println!("{}: valid (hash {:016x})", file.display(), policy.hash());
            for w in policy.warnings() {
                println!("warning: {w}");
            }
            print_rules(&policy);
        }
        PolicyCommand::Show { policy } => {
            print_rules(&load_policy(Some(&PathBuf::from(policy)))?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn users_command(cmd: &UsersCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        UsersCommand::Add { file, db, name } => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("reading the password from standard input")?;
            let password = line.trim_end_matches(['\r', '\n']);
            anyhow::ensure!(!password.is_empty(), "empty password on standard input");
            mongoguard::auth::users::add(file, name, password, db)?;
            println!("added {db}.{name} to {}", file.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One admin API call over HTTP/1.1 (bounded: 10 s); prints the JSON answer, exits 1 on a
/// non-2xx status.
fn admin_command(args: &AdminArgs) -> anyhow::Result<ExitCode> {
    use std::io::{Read, Write};
    let (method, path) = match &args.action {
        AdminAction::Connections => ("GET", "/connections".to_owned()),
        AdminAction::Kill { id } => ("POST", format!("/connections/{id}/kill")),
        AdminAction::Pause => ("POST", "/pause".to_owned()),
        AdminAction::Resume => ("POST", "/resume".to_owned()),
        AdminAction::ResetStats => ("POST", "/stats/reset".to_owned()),
        AdminAction::Drain { server } => ("POST", format!("/servers/{server}/drain")),
        AdminAction::Enable { server } => ("POST", format!("/servers/{server}/enable")),
    };
    let auth = match &args.token_file {
        Some(f) => {
            let token =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            format!("Authorization: Bearer {}\r\n", token.trim_end())
        }
        None => String::new(),
    };
    let bound = Duration::from_secs(10);
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&args.admin)
        .with_context(|| format!("--admin {}", args.admin))?
        .next()
        .with_context(|| format!("--admin {}: no address", args.admin))?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, bound)
        .with_context(|| format!("connecting to the admin listener at {addr}"))?;
    s.set_read_timeout(Some(bound))?;
    s.set_write_timeout(Some(bound))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\n{auth}\r\n"
    )?;
    let mut raw = Vec::new();
    s.take(16 << 20).read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status in the admin listener's answer")?;
    println!("{}", body.trim_end());
    Ok(if (200..300).contains(&status) {
        ExitCode::SUCCESS
    } else {
        eprintln!("mongoguard admin: {method} {path}: HTTP {status}");
        ExitCode::from(1)
    })
}

fn man() -> anyhow::Result<ExitCode> {
    let cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    clap_mangen::Man::new(cmd)
        .render(&mut out)
        .context("writing the manual page")?;
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        None => run(&cli.run),
        Some(Command::Run(args)) => run(args),
        Some(Command::Check(args)) => check(args),
        Some(Command::Policy(cmd)) => policy_command(cmd),
        Some(Command::Users(cmd)) => users_command(cmd),
        Some(Command::Completions { shell }) => {
            let mut cmd = Cli::command();
            clap_complete::generate(*shell, &mut cmd, "mongoguard", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Man) => man(),
        Some(Command::Admin(args)) => admin_command(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mongoguard: {e:#}");
            ExitCode::from(2)
        }
    }
}
