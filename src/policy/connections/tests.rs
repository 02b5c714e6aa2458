use std::time::{Duration, Instant};

use super::*;

fn v(s: &str) -> Version {
    Version::parse(s).unwrap_or_else(|| panic!("{s:?} parses"))
}

#[test]
fn versions_compare_numerically_by_dotted_components() {
    assert!(v("3.10.0") > v("3.9.9"), "numeric, not lexical");
    assert!(v("10") > v("9.99"));
    assert_eq!(v("3.12"), v("3.12.0"));
    assert_eq!(v("3.12").cmp(&v("3.12.0.0")), Ordering::Equal);
    assert!(v("3.12.1") > v("3.12"));
    // Suffixes are ignored.
    assert_eq!(v("4.0.0-beta.2"), v("4.0.0"));
    assert_eq!(v("4.0.0+git.abc"), v("4.0"));
    assert_eq!(v("v2.1.3"), v("2.1.3"));
    assert_eq!(v("6.0.0rc1"), v("6.0.0"));
    assert_eq!(v("1.2.x"), v("1.2"));
    assert_eq!(v("2.9.0 (legacy)").to_string(), "2.9.0");
    for bad in ["", "beta", "-1", "x.1", "+git"] {
        assert_eq!(Version::parse(bad), None, "{bad:?}");
    }
}

fn params(mins: &[(&str, &str)]) -> ConnectionParams {
    ConnectionParams {
        min_versions: mins
            .iter()
            .map(|(n, m)| ((*n).to_owned(), (*m).to_owned(), v(m)))
            .collect(),
        ..ConnectionParams::default()
    }
}

#[test]
fn outdated_drivers_by_name_with_wrappers_and_unknown_names() {
    let p = params(&[("nodejs", "4.0.0"), ("PyMongo", "3.12")]);
    let o = outdated("nodejs 3.7.4", &p).expect("3.7.4 < 4.0.0");
    assert_eq!((o.name.as_str(), o.found.as_str()), ("nodejs", "3.7.4"));
    assert_eq!(o.minimum, "4.0.0");
    assert_eq!(outdated("nodejs 4.0.0", &p), None, "equal is not below");
    assert_eq!(outdated("nodejs 4.0.0-beta", &p), None, "suffix ignored");
    assert_eq!(outdated("nodejs 6.3.0", &p), None);
    assert!(outdated("PyMongo 3.11.4", &p).is_some());
    assert_eq!(outdated("PyMongo 3.12", &p), None);
    assert!(
        outdated("pymongo 3.2", &p).is_some(),
        "names compare case-insensitively"
    );
    // Wrappers: every name component against its own version component.
    let o = outdated("nodejs|Mongoose 3.6.0|5.13.0", &p).expect("the nodejs part is old");
    assert_eq!((o.name.as_str(), o.found.as_str()), ("nodejs", "3.6.0"));
    assert_eq!(outdated("nodejs|Mongoose 6.3.0|3.0.0", &p), None);
    let o = outdated("Motor|PyMongo 3.3.0|3.11", &p).expect("second component");
    assert_eq!((o.name.as_str(), o.found.as_str()), ("PyMongo", "3.11"));
    // Fewer versions than names: the first version stands for all.
    assert!(outdated("Mongoose|nodejs 3.1.0", &p).is_some());
    // Unknown names, unreadable versions, no version, no list: never.
    assert_eq!(outdated("mongo-rust-driver 0.1.0", &p), None);
    assert_eq!(outdated("nodejs unknown", &p), None);
    assert_eq!(outdated("nodejs", &p), None);
    assert_eq!(outdated("-", &p), None);
    assert_eq!(outdated("other", &p), None);
    assert_eq!(outdated("nodejs 1.0", &ConnectionParams::default()), None);
}

#[test]
fn housekeeping_commands() {
    for c in [
        "hello",
        "isMaster",
        "ismaster",
        "ping",
        "saslStart",
        "saslContinue",
    ] {
        assert!(is_housekeeping(c), "{c}");
    }
    for c in ["find", "insert", "getMore", "endSessions", "other"] {
        assert!(!is_housekeeping(c), "{c}");
    }
}

#[test]
fn the_window_slides_over_a_minute() {
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut w = Window::new(t0);
    for s in 0..30 {
        w.arrived();
        w.opened(at(s));
        w.closed(at(s), 2);
    }
    // Monitoring connections: arrived, never opened, closed with no application request.
    w.arrived();
    w.closed(at(10), 0);
    let c = w.take(at(30));
    assert_eq!(
        (c.opened, c.closed, c.requests, c.arrived),
        (30, 30, 60, 31)
    );
    // Arrivals reset at each report; the minute slides.
    let c = w.take(at(45));
    assert_eq!((c.opened, c.closed, c.requests, c.arrived), (30, 30, 60, 0));
    // At 75 s the last minute is seconds 16 to 75: 14 of the 30.
    let c = w.take(at(75));
    assert_eq!((c.opened, c.closed, c.requests), (14, 14, 28), "{c:?}");
    let c = w.take(at(60 + 29));
    assert_eq!(c.opened, 0, "{c:?}");
    // Second 62 reuses second 2's slot, which starts empty: the minute at 62 s is the new
    // connection plus seconds 3 to 29 (27 opened and closed), not second 2's.
    w.opened(at(62));
    let c = w.take(at(62));
    assert_eq!((c.opened, c.closed), (28, 27));
}

fn pair<'a>(app: &'a str, driver: &'a str, counts: WindowCounts, open: u64) -> PairCounts<'a> {
    PairCounts {
        app,
        driver,
        counts,
        open,
    }
}

fn counts(opened: u64, closed: u64, requests: u64, arrived: u64) -> WindowCounts {
    WindowCounts {
        opened,
        closed,
        requests,
        arrived,
    }
}

fn rules(findings: &[Finding]) -> Vec<(RuleId, &str)> {
    findings.iter().map(|f| (f.rule, f.app.as_str())).collect()
}

fn policy(text: &str) -> Policy {
    Policy::from_toml(text, "p.toml").unwrap_or_else(|e| panic!("{text}: {e}"))
}

#[test]
fn c001_needs_both_many_connections_and_few_requests() {
    let p = policy("[rules]\nC001 = { action = \"warn\", max_connections_per_minute = 10, min_requests_per_connection = 5 }\n");
    let d = "php 1.0";
    // 11 connections (> 10), 2 requests each: fires.
    let f = assess(&[pair("php-fpm", d, counts(11, 11, 22, 11), 0)], &p);
    assert_eq!(rules(&f), [(RuleId::C001, "php-fpm")]);
    assert!(f[0].detail.contains("11 connections"), "{}", f[0].detail);
    assert!(f[0].detail.contains("2.0 requests"), "{}", f[0].detail);
    assert_eq!(f[0].driver, None);
    assert_eq!((f[0].action, f[0].mode), (Action::Warn, Mode::Enforce));
    // Exactly at the threshold: no.
    assert!(assess(&[pair("php-fpm", d, counts(10, 10, 10, 10), 0)], &p).is_empty());
    // Many connections, but each does real work (5 per connection on average): no.
    assert!(assess(&[pair("php-fpm", d, counts(50, 50, 250, 50), 0)], &p).is_empty());
    // Many opened, none closed yet (average unknown): no.
    assert!(assess(&[pair("php-fpm", d, counts(50, 0, 0, 50), 50)], &p).is_empty());
    // Summed over an application's drivers.
    let f = assess(
        &[
            pair("php-fpm", "a 1", counts(6, 6, 6, 6), 0),
            pair("php-fpm", "b 1", counts(6, 6, 6, 6), 0),
            pair("steady", "a 1", counts(6, 6, 6, 6), 0),
        ],
        &p,
    );
    assert_eq!(rules(&f), [(RuleId::C001, "php-fpm")]);
}

#[test]
fn c001_monitoring_connections_do_not_make_a_pooled_app_short_lived() {
    let p = policy("[rules]\nC001 = { action = \"warn\", max_connections_per_minute = 10, min_requests_per_connection = 5 }\n");
    let t0 = Instant::now();
    let mut w = Window::new(t0);
    // A pooled application: two connections doing 500 requests...
    for _ in 0..2 {
        w.arrived();
        w.opened(t0);
    }
    // ...and its driver's monitoring connections, opened and closed 100 times, hello only.
    for s in 0..100u64 {
        w.arrived();
        w.closed(t0 + Duration::from_millis(s * 100), 0);
    }
    let c = w.take(t0 + Duration::from_secs(10));
    assert_eq!((c.opened, c.closed), (2, 0));
    assert!(assess(&[pair("steady", "d 1", c, 2)], &p).is_empty());
    // Were the monitoring connections counted (what C001 must not do), it would fire:
    let wrong = counts(102, 100, 0, 102);
    assert_eq!(assess(&[pair("steady", "d 1", wrong, 2)], &p).len(), 1);
}

#[test]
fn c002_per_driver_while_unnamed_connections_arrive_or_stay_open() {
    let p = Policy::standard();
    let f = assess(
        &[
            pair("-", "nodejs 6.0.0", counts(0, 0, 0, 3), 3),
            pair("-", "PyMongo 4.0", counts(0, 0, 0, 0), 1),
            pair("-", "gone 1.0", counts(0, 0, 0, 0), 0),
            pair("billing", "nodejs 6.0.0", counts(0, 0, 0, 5), 5),
        ],
        &p,
    );
    assert_eq!(rules(&f), [(RuleId::C002, "-"), (RuleId::C002, "-")]);
    assert_eq!(f[0].driver.as_deref(), Some("nodejs 6.0.0"));
    assert!(f[0].detail.contains("3 open, 3 arrived"), "{}", f[0].detail);
    assert_eq!(f[1].driver.as_deref(), Some("PyMongo 4.0"));
    let off = policy("[rules]\nC002 = \"off\"\n");
    assert!(assess(&[pair("-", "nodejs 6.0.0", counts(0, 0, 0, 3), 3)], &off).is_empty());
}

#[test]
fn c003_in_strict_not_in_standard_and_while_connections_are_open() {
    let old = "mongo-java-driver 3.8.2";
    let strict = Policy::profile("strict").unwrap();
    let standard = Policy::standard();
    let f = assess(&[pair("billing", old, counts(0, 0, 0, 1), 1)], &strict);
    assert_eq!(rules(&f), [(RuleId::C003, "billing")]);
    assert_eq!(f[0].driver.as_deref(), Some(old));
    assert!(f[0].detail.contains("3.8.2"), "{}", f[0].detail);
    assert!(f[0].detail.contains("3.11.0"), "{}", f[0].detail);
    assert!(assess(&[pair("billing", old, counts(0, 0, 0, 1), 1)], &standard).is_empty());
    // A pool opened long ago still holds the finding; a driver gone does not.
    assert_eq!(
        assess(&[pair("billing", old, counts(0, 0, 0, 0), 4)], &strict).len(),
        1
    );
    assert!(assess(&[pair("billing", old, counts(0, 0, 0, 0), 0)], &strict).is_empty());
    let new = "mongo-java-driver 4.11.1";
    assert!(assess(&[pair("billing", new, counts(0, 0, 0, 1), 1)], &strict).is_empty());
    // Configured in a file.
    let p = policy(
        "[rules]\nC003 = { action = \"warn\", min_versions = { \"nodejs\" = \"4.0.0\" } }\n",
    );
    assert_eq!(
        assess(
            &[pair(
                "web",
                "nodejs|Mongoose 3.7.0|5.0.0",
                counts(0, 0, 0, 1),
                1
            )],
            &p
        )
        .len(),
        1
    );
    // The file's list replaces the profile's.
    assert!(assess(&[pair("billing", old, counts(0, 0, 0, 1), 1)], &p).is_empty());
}

#[test]
fn overrides_and_audit_mode_apply_per_application() {
    let text = "trust_app_name = true\n\
                [rules]\nC001 = { action = \"warn\", max_connections_per_minute = 1 }\n\
                [[overrides]]\napp = \"legacy-*\"\nrules = { C001 = \"off\" }\n\
                [[overrides]]\nnamespace = \"x.*\"\nrules = { C001 = \"off\" }\n\
                [[overrides]]\napp = \"audited\"\nmode = \"audit\"\n";
    let p = policy(text);
    let c = counts(5, 5, 5, 5);
    let f = assess(
        &[
            pair("legacy-cron", "d 1", c, 0),
            pair("web", "d 1", c, 0),
            pair("audited", "d 1", c, 0),
        ],
        &p,
    );
    // legacy-* off by its override; the namespace override never matches a finding.
    assert_eq!(
        rules(&f),
        [(RuleId::C001, "audited"), (RuleId::C001, "web")]
    );
    assert_eq!(f[0].mode, Mode::Audit);
    assert_eq!(f[1].mode, Mode::Enforce);
    // Turning C001 off on the (claimed) application name relaxes: refused untrusted.
    let untrusted = "[[overrides]]\napp = \"legacy-*\"\nrules = { C001 = \"off\" }\n";
    let err = Policy::from_toml(untrusted, "p.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("trust_app_name"), "{err}");
    // Global audit mode.
    let p = policy(
        "mode = \"audit\"\n[rules]\nC001 = { action = \"warn\", max_connections_per_minute = 1 }\n",
    );
    let f = assess(&[pair("web", "d 1", c, 0)], &p);
    assert_eq!((f[0].action, f[0].mode), (Action::Warn, Mode::Audit));
}

#[test]
fn the_policy_refuses_block_and_bad_parameters_for_connection_standards() {
    let cases = [
        ("[rules]\nC001 = \"block\"\n", "cannot block"),
        ("[rules]\nC002 = { action = \"block\" }\n", "cannot block"),
        (
            "[[overrides]]\nuser = \"etl\"\nrules = { C003 = \"block\" }\n",
            "cannot block",
        ),
        (
            "[rules]\nC002 = { action = \"warn\", max_connections_per_minute = 3 }\n",
            "does not apply",
        ),
        (
            "[rules]\nC001 = { action = \"warn\", min_versions = { \"nodejs\" = \"4\" } }\n",
            "does not apply",
        ),
        (
            "[rules]\nC001 = { action = \"warn\", min_requests_per_connection = 0 }\n",
            "min_requests_per_connection",
        ),
        (
            "[rules]\nC003 = { action = \"warn\", min_versions = { \"nodejs\" = \"latest\" } }\n",
            "is not a version",
        ),
        (
            "[rules]\nC003 = { action = \"warn\", min_versions = { \"nodejs|x\" = \"4\" } }\n",
            "bad driver name",
        ),
    ];
    for (text, want) in cases {
        let err = Policy::from_toml(text, "p.toml").unwrap_err().to_string();
        assert!(err.contains(want), "{text:?}: {err}");
        assert!(!err.contains("  "), "one line, no runs of spaces: {err}");
    }
    for profile in ["standard", "strict", "audit"] {
        let p = Policy::profile(profile).unwrap();
        assert_eq!(p.action(RuleId::C001), Action::Warn, "{profile}");
        assert_eq!(p.action(RuleId::C002), Action::Warn, "{profile}");
        assert_eq!(p.params().connections.max_connections_per_minute, 60);
        assert_eq!(p.params().connections.min_requests_per_connection, 5);
        assert!(!p.params().connections.min_versions.is_empty());
    }
    assert_eq!(Policy::standard().action(RuleId::C003), Action::Off);
    assert_eq!(
        Policy::profile("strict").unwrap().action(RuleId::C003),
        Action::Warn
    );
}
