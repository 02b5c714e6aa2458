//! Whether a regular expression is anchored at the start of the string.

/// Whether a regex can only match from the start of the string (so an index scan can be
/// bounded): every top-level alternative starts with `^` or `\A`, and it is not
/// case-insensitive. `^a|b` is not anchored. With the `m` option `^` also matches after a
/// newline, so only `\A` anchors; unknown options and inline flag groups `(?i)` / `(?m)`
/// make it unanchored.
pub fn regex_is_anchored(pattern: &str, options: &str) -> bool {
    regex_is_anchored_with(pattern, options, true)
}

/// [`regex_is_anchored`], with a choice about case: when `case_insensitive_unanchors` is
/// false, the `i` option and `(?i)` flag groups are accepted (a policy that does not count
/// case-insensitive prefixes as scans). `m`, `(?m)` and unknown options still decide as
/// there.
pub fn regex_is_anchored_with(
    pattern: &str,
    options: &str,
    case_insensitive_unanchors: bool,
) -> bool {
    let Some(multiline) = multiline_option(options, case_insensitive_unanchors) else {
        return false;
    };
    let b = pattern.as_bytes();
    let anchored_at = |i: usize| match b.get(i..) {
        Some(rest) => rest.starts_with(b"\\A") || (!multiline && rest.starts_with(b"^")),
        None => false,
    };
    if !anchored_at(0) {
        return false;
    }
    let (mut i, mut groups) = (0usize, 0usize);
    while let Some(&c) = b.get(i) {
        match c {
            b'\\' if b.get(i + 1) == Some(&b'Q') => match end_of_quote(b, i) {
                Some(next) => i = next,
                None => return true,
            },
            b'\\' => i += 2,
            b'[' => i = end_of_class(b, i),
            b'(' => {
                if flag_group_unanchors(b, i, case_insensitive_unanchors) {
                    return false;
                }
                groups += 1;
                i += 1;
            }
            b')' => {
                groups = groups.saturating_sub(1);
                i += 1;
            }
            b'|' if groups == 0 => {
                if !anchored_at(i + 1) {
                    return false;
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    true
}

/// Whether the `m` option is set; `None` when an option makes every pattern unanchored (an
/// unknown one, or `i` when case counts).
fn multiline_option(options: &str, case_insensitive_unanchors: bool) -> Option<bool> {
    let mut multiline = false;
    for c in options.chars() {
        match c {
            'm' => multiline = true,
            'i' if !case_insensitive_unanchors => {}
            's' | 'x' | 'u' => {}
            _ => return None,
        }
    }
    Some(multiline)
}

/// Just past the `\E` that ends the `\Q` quote starting at `i`; `None` when the quote runs to
/// the end of the pattern (everything after `\Q` is quoted).
fn end_of_quote(b: &[u8], i: usize) -> Option<usize> {
    b.get(i + 2..)
        .and_then(|r| r.windows(2).position(|w| w == b"\\E"))
        .map(|p| i + 2 + p + 2)
}

/// Just past the `]` that closes the character class opening at `i`.
fn end_of_class(b: &[u8], mut i: usize) -> usize {
    i += 1;
    if b.get(i) == Some(&b'^') {
        i += 1;
    }
    if b.get(i) == Some(&b']') {
        i += 1; // a leading `]` is a literal
    }
    while let Some(&c) = b.get(i) {
        i += if c == b'\\' { 2 } else { 1 };
        if c == b']' {
            break;
        }
    }
    i
}

/// Whether the group opening at `i` is an inline flag group that sets `m` (or `i`, when case
/// counts): `(?m)`, `(?im:...)`, `(?-m)` (a `-` run is read the same way).
fn flag_group_unanchors(b: &[u8], i: usize, case_insensitive_unanchors: bool) -> bool {
    if b.get(i + 1) != Some(&b'?') {
        return false;
    }
    let flags = b.get(i + 2..).unwrap_or_default();
    let mut run = flags
        .iter()
        .take_while(|f| f.is_ascii_alphabetic() || **f == b'-');
    run.any(|f| *f == b'm' || (case_insensitive_unanchors && *f == b'i'))
}
