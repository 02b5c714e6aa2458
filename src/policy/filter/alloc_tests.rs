//! The hot-path analyses must not allocate. A counting global allocator would prove it at
//! run time, but it needs `unsafe`, which this crate forbids; so this test reads the
//! sources of the hot-path files and refuses any allocating construct outside comments and
//! test modules. (`shape.rs` is exempt: it renders violations only.) The rule families built on
//! these analyses are held to the same rule; `tests/alloc_free.rs` measures the whole path.

const HOT_PATH: [(&str, &str); 14] = [
    ("../queries.rs", include_str!("../queries.rs")),
    ("../indexes.rs", include_str!("../indexes.rs")),
    ("../documents.rs", include_str!("../documents.rs")),
    ("mod.rs", include_str!("mod.rs")),
    ("tautology.rs", include_str!("tautology.rs")),
    ("walk.rs", include_str!("walk.rs")),
    ("js.rs", include_str!("js.rs")),
    ("anchor.rs", include_str!("anchor.rs")),
    ("tautology/fields.rs", include_str!("tautology/fields.rs")),
    (
        "tautology/constant.rs",
        include_str!("tautology/constant.rs"),
    ),
    ("walk/expr.rs", include_str!("walk/expr.rs")),
    ("tautology/atoms.rs", include_str!("tautology/atoms.rs")),
    ("tautology/number.rs", include_str!("tautology/number.rs")),
    ("verdict.rs", include_str!("verdict.rs")),
];

const FORBIDDEN: [&str; 16] = [
    "String",
    "Vec",
    "Box",
    "format!",
    "vec!",
    "to_owned",
    "to_string",
    "to_vec",
    "collect",
    "HashMap",
    "HashSet",
    "BTree",
    "Rc<",
    "Arc<",
    "into_owned",
    "to_raw",
];

#[test]
fn hot_path_sources_use_no_allocating_constructs() {
    for (file, src) in HOT_PATH {
        // Test modules sit at the end of a file.
        let code = src.split("#[cfg(test)]").next().unwrap_or(src);
        for (n, line) in code.lines().enumerate() {
            let line = line.split(" //").next().unwrap_or(line).trim_start();
            if line.starts_with("//") {
                continue;
            }
            // `RawBsonRef::String` is a borrowed variant, not an allocation.
            let line = line.replace("RawBsonRef::String", "RawBsonRef::Str");
            for word in FORBIDDEN {
                assert!(
                    !line.contains(word),
                    "{file}:{}: `{word}` on the hot path: {line}",
                    n + 1
                );
            }
        }
    }
}
