//! Dotted-path access used by updates, upserts and aggregation.

use bson::{Bson, Document};

use super::{bad_value, uerr, Result};

/// The value at a dotted path (numeric components index arrays), without array traversal.
pub(crate) fn get_path<'a>(doc: &'a Document, parts: &[&str]) -> Option<&'a Bson> {
    let (first, rest) = parts.split_first()?;
    let mut cur = doc.get(*first)?;
    for p in rest {
        cur = match cur {
            Bson::Document(d) => d.get(*p)?,
            Bson::Array(a) => a.get(p.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn not_viable<T>(field: &str, parent: &Bson) -> Result<T> {
    uerr(
        28,
        "PathNotViable",
        format!(
            "Cannot create field '{field}' in element of type {:?}",
            parent.element_type()
        ),
    )
}

/// Sets a dotted path, creating intermediate documents.
pub(crate) fn set_path(doc: &mut Document, parts: &[&str], val: Bson) -> Result<()> {
    let Some((first, rest)) = parts.split_first() else {
        return Ok(());
    };
    if rest.is_empty() {
        doc.insert(*first, val);
        return Ok(());
    }
    match doc.get_mut(*first) {
        None => {
            let mut d = Document::new();
            set_path(&mut d, rest, val)?;
            doc.insert(*first, d);
            Ok(())
        }
        Some(Bson::Document(d)) => set_path(d, rest, val),
        Some(Bson::Array(a)) => set_in_array(a, rest, val),
        Some(other) => not_viable(rest[0], other),
    }
}

fn set_in_array(a: &mut Vec<Bson>, parts: &[&str], val: Bson) -> Result<()> {
    let Some((first, rest)) = parts.split_first() else {
        return Ok(());
    };
    let Ok(idx) = first.parse::<usize>() else {
        return not_viable(first, &Bson::Array(Vec::new()));
    };
    if idx > 1_000_000 {
        return bad_value("array index too large for the mongoguard stand-in");
    }
    while a.len() <= idx {
        a.push(Bson::Null);
    }
    if rest.is_empty() {
        a[idx] = val;
        return Ok(());
    }
    match &mut a[idx] {
        Bson::Document(d) => set_path(d, rest, val),
        Bson::Array(inner) => set_in_array(inner, rest, val),
        slot @ Bson::Null => {
            let mut d = Document::new();
            set_path(&mut d, rest, val)?;
            *slot = Bson::Document(d);
            Ok(())
        }
        other => not_viable(rest[0], other),
    }
}

/// Removes a dotted path (array elements are set to null, as MongoDB does).
pub(crate) fn unset_path(doc: &mut Document, parts: &[&str]) {
    let Some((first, rest)) = parts.split_first() else {
        return;
    };
    if rest.is_empty() {
        doc.remove(*first);
        return;
    }
    let mut cur = match doc.get_mut(*first) {
        Some(v) => v,
        None => return,
    };
    for (i, p) in rest.iter().enumerate() {
        let last = i + 1 == rest.len();
        cur = match cur {
            Bson::Document(d) => {
                if last {
                    d.remove(*p);
                    return;
                }
                match d.get_mut(*p) {
                    Some(v) => v,
                    None => return,
                }
            }
            Bson::Array(a) => {
                let Ok(idx) = p.parse::<usize>() else { return };
                let Some(slot) = a.get_mut(idx) else { return };
                if last {
                    *slot = Bson::Null;
                    return;
                }
                slot
            }
            _ => return,
        };
    }
}

/// The document an upsert starts from: the equality fields of the query.
pub(crate) fn seed_from_query(q: &Document) -> Document {
    let mut out = Document::new();
    seed_into(q, &mut out);
    out
}

fn seed_into(q: &Document, out: &mut Document) {
    for (k, v) in q {
        if k == "$and" {
            if let Bson::Array(items) = v {
                for i in items {
                    if let Bson::Document(d) = i {
                        seed_into(d, out);
                    }
                }
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        let val = match v {
            Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
                match d.get("$eq") {
                    Some(e) => e.clone(),
                    None => continue,
                }
            }
            Bson::RegularExpression(_) => continue,
            other => other.clone(),
        };
        let parts: Vec<&str> = k.split('.').collect();
        let _ = set_path(out, &parts, val);
    }
}
