use std::path::PathBuf;

use bson::{rawdoc, RawDocumentBuf};

use super::*;
use crate::policy::Policy;

fn temp_file(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("mg-allowlist-{}-{tag}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("allowlist.toml")
}

fn config(mode: AllowlistMode, path: &Path) -> AllowlistConfig {
    AllowlistConfig {
        mode,
        file: Some(path.to_owned()),
        ..AllowlistConfig::default()
    }
}

fn policy(a001: &str) -> Policy {
    Policy::from_toml(
        &format!("extends = \"standard\"\n[rules]\nA001 = \"{a001}\"\n"),
        "test",
    )
    .unwrap()
}

/// Runs one command through `list` as the guard does: capture, then check.
fn send(
    list: &Allowlist,
    policy: &Policy,
    app: Option<&str>,
    body: &RawDocumentBuf,
) -> Option<(RuleId, Action, Option<String>)> {
    let db = body.get_str("$db").unwrap();
    let view = CommandView::command(db, body).unwrap();
    let mut scratch = ShapeScratch::default();
    scratch.capture(&view);
    let rctx = RequestContext {
        app,
        ..RequestContext::default()
    };
    list.check(policy, &view, &rctx, &scratch)
        .map(|v| (v.rule, v.action, v.filter.map(crate::policy::filter::shape)))
}

fn find(filter: RawDocumentBuf) -> RawDocumentBuf {
    rawdoc! {"find": "users", "filter": filter, "$db": "shop"}
}

fn traffic(list: &Allowlist, p: &Policy) {
    send(list, p, Some("billing"), &find(rawdoc! {"password": "x"}));
    send(list, p, Some("billing"), &find(rawdoc! {"password": "y"}));
    send(
        list,
        p,
        Some("billing"),
        &rawdoc! {"update": "orders", "updates": [{"q": {"_id": 1}, "u": {"$set": {"a": 1}}}], "$db": "shop"},
    );
    send(
        list,
        p,
        None,
        &rawdoc! {"count": "users", "query": {}, "$db": "shop"},
    );
    // Not a tracked command: never learned, never checked.
    send(
        list,
        p,
        Some("billing"),
        &rawdoc! {"insert": "users", "documents": [{"a": 1}], "$db": "shop"},
    );
}

#[test]
fn learn_write_load_enforce() {
    let path = temp_file("loop");
    let p = policy("block");
    let learner = Allowlist::start(&config(AllowlistMode::Learn, &path)).unwrap();
    traffic(&learner, &p);
    assert_eq!(learner.counts(), (2, 3));
    assert!(learner.save());
    assert!(!learner.save(), "nothing new: not written again");
    let text = std::fs::read_to_string(&path).unwrap();
    let expected = format!(
        "{}version = 1\n\n[[app]]\nname = '-'\nshapes = [\n    'count shop.users {{}}',\n]\n\n\
         [[app]]\nname = 'billing'\nshapes = [\n    'find shop.users {{\"password\": \"<string>\"}}',\n    \
         'update shop.orders {{\"_id\": \"<int>\"}}',\n]\n",
        file::HEADER_FOR_TESTS
    );
    assert_eq!(text, expected);

    let enforcer = Allowlist::start(&config(AllowlistMode::Enforce, &path)).unwrap();
    // The learned shapes pass, with other literals.
    assert_eq!(
        send(
            &enforcer,
            &p,
            Some("billing"),
            &find(rawdoc! {"password": "z"})
        ),
        None
    );
    assert_eq!(
        send(
            &enforcer,
            &p,
            None,
            &rawdoc! {"count": "users", "query": {}, "$db": "shop"}
        ),
        None
    );
    // The textbook injection: an operator where a literal was.
    let v = send(
        &enforcer,
        &p,
        Some("billing"),
        &find(rawdoc! {"password": {"$ne": null}}),
    )
    .expect("A001");
    assert_eq!(v.0, RuleId::A001);
    assert_eq!(v.1, Action::Block);
    assert_eq!(v.2.as_deref(), Some(r#"{"password": {"$ne": "<null>"}}"#));
    // A known shape of another application is new for this one.
    assert!(send(&enforcer, &p, None, &find(rawdoc! {"password": "x"})).is_some());
    // An application absent from the file: enforce by default.
    assert!(send(&enforcer, &p, Some("etl"), &find(rawdoc! {"password": "x"})).is_some());
    // Not tracked: not checked.
    assert_eq!(
        send(
            &enforcer,
            &p,
            Some("billing"),
            &rawdoc! {"insert": "users", "documents": [{"a": 1}], "$db": "shop"}
        ),
        None
    );
    // The action is the policy's: warn, off (nothing), audit mode.
    let v = send(&enforcer, &policy("warn"), Some("etl"), &find(rawdoc! {})).unwrap();
    assert_eq!(v.1, Action::Warn);
    assert_eq!(
        send(&enforcer, &policy("off"), Some("etl"), &find(rawdoc! {})),
        None
    );
    let audit = Policy::from_toml(
        "extends = \"standard\"\nmode = \"audit\"\n[rules]\nA001 = \"block\"\n",
        "t",
    )
    .unwrap();
    assert_eq!(
        send(&enforcer, &audit, Some("etl"), &find(rawdoc! {}))
            .unwrap()
            .1,
        Action::Warn
    );
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn unknown_app_allow_lets_unlisted_applications_through_only() {
    let path = temp_file("unknown");
    let p = policy("block");
    let learner = Allowlist::start(&config(AllowlistMode::Learn, &path)).unwrap();
    traffic(&learner, &p);
    learner.save();
    let mut c = config(AllowlistMode::Enforce, &path);
    c.unknown_app = UnknownApp::Allow;
    let list = Allowlist::start(&c).unwrap();
    assert_eq!(
        send(&list, &p, Some("etl"), &find(rawdoc! {"x": {"$gt": 1}})),
        None
    );
    assert!(send(&list, &p, Some("billing"), &find(rawdoc! {"x": 1})).is_some());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn relearning_the_same_traffic_gives_the_same_bytes() {
    let p = policy("block");
    let (a, b) = (temp_file("det-a"), temp_file("det-b"));
    let first = Allowlist::start(&config(AllowlistMode::Learn, &a)).unwrap();
    traffic(&first, &p);
    first.save();
    // The same traffic in another order, into another file.
    let second = Allowlist::start(&config(AllowlistMode::Learn, &b)).unwrap();
    send(
        &second,
        &p,
        None,
        &rawdoc! {"count": "users", "query": {}, "$db": "shop"},
    );
    send(
        &second,
        &p,
        Some("billing"),
        &rawdoc! {"update": "orders", "updates": [{"q": {"_id": 7}, "u": {"$set": {"a": 1}}}], "$db": "shop"},
    );
    send(
        &second,
        &p,
        Some("billing"),
        &find(rawdoc! {"password": "q"}),
    );
    second.save();
    let (ta, tb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert_eq!(ta, tb);
    // Learning again on top of the file adds nothing and keeps it byte for byte.
    let again = Allowlist::start(&config(AllowlistMode::Learn, &a)).unwrap();
    traffic(&again, &p);
    again.save();
    assert_eq!(std::fs::read(&a).unwrap(), ta);
    for f in [a, b] {
        let _ = std::fs::remove_dir_all(f.parent().unwrap());
    }
}

#[test]
fn caps_bound_learning_and_loading() {
    let p = policy("block");
    let path = temp_file("caps");
    let mut c = config(AllowlistMode::Learn, &path);
    c.max_apps = 2;
    c.max_shapes_per_app = 2;
    let list = Allowlist::start(&c).unwrap();
    for app in ["a", "b", "c"] {
        for field in ["x", "y", "z"] {
            let mut filter = RawDocumentBuf::new();
            filter.append(bson::cstr!("k"), 1);
            let body = rawdoc! {"find": field, "filter": filter, "$db": "d"};
            send(&list, &p, Some(app), &body);
        }
    }
    assert_eq!(list.counts(), (2, 4), "two apps of two shapes");
    list.save();

    // A file over the caps loads up to them (file order); the rest is unknown.
    let mut e = config(AllowlistMode::Enforce, &path);
    e.max_apps = 1;
    e.max_shapes_per_app = 1;
    let small = Allowlist::start(&e).unwrap();
    assert_eq!(small.counts(), (1, 1));
    assert_eq!(
        send(
            &small,
            &p,
            Some("a"),
            &rawdoc! {"find": "x", "filter": {"k": 2}, "$db": "d"}
        ),
        None
    );
    assert!(send(
        &small,
        &p,
        Some("a"),
        &rawdoc! {"find": "y", "filter": {"k": 2}, "$db": "d"}
    )
    .is_some());
    assert!(send(
        &small,
        &p,
        Some("b"),
        &rawdoc! {"find": "x", "filter": {"k": 2}, "$db": "d"}
    )
    .is_some());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// SIGHUP and `POST /reload` both reload the allowlist in enforce mode, on different
/// threads: unserialised, a reload that read the older file could install it after a later
/// reload installed the newer one (the policy's race, here for the allowlist). The first
/// reload reads v1 and is held; the file becomes v2 and a second reload runs; then the
/// first goes on. v2 must be in force at the end.
#[test]
fn concurrent_reloads_never_install_the_older_allowlist() {
    let p = policy("block");
    let path = temp_file("race");
    let v1 = "version = 1\n[[app]]\nname = \"billing\"\nshapes = ['find shop.users {\"password\": \"<string>\"}']\n";
    let v2 = "version = 1\n[[app]]\nname = \"billing\"\nshapes = ['find shop.users {\"email\": \"<string>\"}']\n";
    std::fs::write(&path, v1).unwrap();
    let list =
        std::sync::Arc::new(Allowlist::start(&config(AllowlistMode::Enforce, &path)).unwrap());
    let l = list.clone();
    crate::reload_race::two_reloads(
        &list.after_read,
        move || l.reload().map(|_| ()),
        || std::fs::write(&path, v2).unwrap(),
    );
    let email = find(rawdoc! {"email": "x"});
    assert_eq!(
        send(&list, &p, Some("billing"), &email),
        None,
        "an older read of the allowlist file was installed over a newer one"
    );
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn a_failed_reload_keeps_the_allowlist_in_force() {
    let p = policy("block");
    let path = temp_file("reload");
    let learner = Allowlist::start(&config(AllowlistMode::Learn, &path)).unwrap();
    traffic(&learner, &p);
    learner.save();
    let list = Allowlist::start(&config(AllowlistMode::Enforce, &path)).unwrap();
    let known = find(rawdoc! {"password": "x"});
    let other = find(rawdoc! {"email": "x"});
    assert_eq!(send(&list, &p, Some("billing"), &known), None);
    for bad in ["", "version = 1\n[[app]\n", "version = 9\n"] {
        std::fs::write(&path, bad).unwrap();
        let err = list.reload().unwrap_err();
        assert!(err.to_string().contains("allowlist.toml"), "{err}");
        // Never "empty = allow everything": the old list still decides.
        assert_eq!(send(&list, &p, Some("billing"), &known), None, "{bad:?}");
        assert!(
            send(&list, &p, Some("billing"), &other).is_some(),
            "{bad:?}"
        );
    }
    std::fs::remove_file(&path).unwrap();
    assert!(list.reload().is_err(), "a missing file");
    assert_eq!(send(&list, &p, Some("billing"), &known), None);
    // A valid file is swapped in.
    std::fs::write(
        &path,
        "version = 1\n[[app]]\nname = \"billing\"\nshapes = ['find shop.users {\"email\": \"<string>\"}']\n",
    )
    .unwrap();
    assert_eq!(list.reload().unwrap().shapes, 1);
    assert_eq!(send(&list, &p, Some("billing"), &other), None);
    assert!(send(&list, &p, Some("billing"), &known).is_some());
    // A missing or invalid file at start is an error in enforce mode, and in learn mode
    // (an existing file that cannot be read is not overwritten).
    std::fs::write(&path, "version = 1\n[[app]\n").unwrap();
    assert!(Allowlist::start(&config(AllowlistMode::Enforce, &path)).is_err());
    assert!(Allowlist::start(&config(AllowlistMode::Learn, &path)).is_err());
    std::fs::remove_file(&path).unwrap();
    assert!(Allowlist::start(&config(AllowlistMode::Enforce, &path)).is_err());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn lines_compare_without_building_them() {
    let parts = Parts {
        command: "find",
        ns: "a.b",
        shape: "{}",
    };
    assert!(parts.is("find a.b {}"));
    assert!(!parts.is("find a.b {} "));
    assert!(!parts.is("find a.bc {}"));
    assert!(!parts.is("find a.b{}"));
    assert_eq!(parts.hash(), fnv(&[b"find a.b {}"]));
}

#[test]
fn off_does_nothing() {
    let list = Allowlist::off();
    let p = policy("block");
    assert_eq!(
        send(&list, &p, Some("x"), &find(rawdoc! {"a": {"$ne": 1}})),
        None
    );
    assert_eq!(list.counts(), (0, 0));
    assert!(!list.save());
}

/// A filter whose shape is too long to capture cannot slip past enforce mode: it is unknown.
#[test]
fn an_untracked_long_shape_is_unknown_not_allowed() {
    let path = temp_file("long");
    let p = policy("block");
    let learner = Allowlist::start(&config(AllowlistMode::Learn, &path)).unwrap();
    traffic(&learner, &p);
    let mut long = RawDocumentBuf::new();
    for i in 0..200 {
        long.append(
            bson::raw::CString::try_from(format!("a_rather_long_field_name_number_{i}")).unwrap(),
            1,
        );
    }
    // Not learned (nothing captured)...
    assert_eq!(
        send(&learner, &p, Some("billing"), &find(long.clone())),
        None
    );
    assert_eq!(learner.counts(), (2, 3));
    learner.save();
    let list = Allowlist::start(&config(AllowlistMode::Enforce, &path)).unwrap();
    // ...and refused in enforce mode, with the reason.
    let body = find(long);
    let view = CommandView::command("shop", &body).unwrap();
    let mut scratch = ShapeScratch::default();
    scratch.capture(&view);
    assert!(scratch.captured().is_none(), "too long to capture");
    let rctx = RequestContext {
        app: Some("billing"),
        ..RequestContext::default()
    };
    let v = list.check(&p, &view, &rctx, &scratch).expect("A001");
    assert_eq!(v.rule, RuleId::A001);
    assert!(v.detail.unwrap().contains("longer than"), "{:?}", v.detail);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
