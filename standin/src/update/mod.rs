//! Update documents: operators (`$set $unset $inc $mul $min $max $push $addToSet $pop $pull
//! $pullAll $rename $setOnInsert $currentDate`) with dotted paths, or a replacement document.
//! Pipeline-style updates and array filters are not supported (reported as errors).

use bson::{Bson, Document};

use crate::bsonutil::values_equal;

mod ops;
mod paths;

use ops::apply_op;
pub(crate) use paths::{get_path, seed_from_query, set_path, unset_path};

/// An update that cannot be applied: (code, codeName, errmsg).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct UpdateError {
    pub(crate) code: i32,
    pub(crate) code_name: &'static str,
    pub(crate) msg: String,
}

pub(super) type Result<T> = std::result::Result<T, UpdateError>;

pub(super) fn uerr<T>(code: i32, code_name: &'static str, msg: impl Into<String>) -> Result<T> {
    Err(UpdateError {
        code,
        code_name,
        msg: msg.into(),
    })
}

pub(super) fn bad_value<T>(msg: impl Into<String>) -> Result<T> {
    uerr(2, "BadValue", msg)
}

/// A parsed update.
#[derive(Debug, Clone)]
pub(crate) enum Update {
    Replace(Document),
    Ops(Vec<(String, String, Bson)>),
}

impl Update {
    pub(crate) fn parse(u: &Bson) -> Result<Update> {
        let d = match u {
            Bson::Document(d) => d,
            Bson::Array(_) => {
                return uerr(
                    9,
                    "FailedToParse",
                    "pipeline-style updates are not supported by the mongoguard stand-in",
                )
            }
            _ => return uerr(9, "FailedToParse", "update must be a document"),
        };
        let is_ops = d.keys().next().is_some_and(|k| k.starts_with('$'));
        if !is_ops {
            if let Some(k) = d.keys().find(|k| k.starts_with('$')) {
                return uerr(
                    52,
                    "DollarPrefixedFieldName",
                    format!("The dollar ($) prefixed field '{k}' is not allowed in a replacement"),
                );
            }
            return Ok(Update::Replace(d.clone()));
        }
        let mut ops = Vec::new();
        let mut paths: Vec<String> = Vec::new();
        for (op, arg) in d {
            if !KNOWN_OPS.contains(&op.as_str()) {
                return uerr(9, "FailedToParse", format!(
                    "Unknown modifier: {op}. Expected a valid update modifier or pipeline-style update specified as an array"
                ));
            }
            let Bson::Document(fields) = arg else {
                return uerr(
                    9,
                    "FailedToParse",
                    format!(
                        "Modifiers operate on fields but we found type {:?} instead",
                        arg.element_type()
                    ),
                );
            };
            for (path, v) in fields {
                if path.is_empty() || path.split('.').any(str::is_empty) {
                    return uerr(
                        56,
                        "EmptyFieldName",
                        format!("empty field name in path '{path}'"),
                    );
                }
                if path.contains('$') {
                    return bad_value(format!(
                        "positional / array-filter path '{path}' is not supported by the mongoguard stand-in"
                    ));
                }
                let mut targets = vec![path.clone()];
                if op == "$rename" {
                    match v.as_str() {
                        Some(to) => targets.push(to.to_string()),
                        None => return bad_value("The 'to' field for $rename must be a string"),
                    }
                }
                for t in targets {
                    if let Some(p) = paths.iter().find(|p| conflicts(p, &t)) {
                        return uerr(
                            40,
                            "ConflictingUpdateOperators",
                            format!("Updating the path '{t}' would create a conflict at '{p}'"),
                        );
                    }
                    paths.push(t);
                }
                ops.push((op.clone(), path.clone(), v.clone()));
            }
        }
        Ok(Update::Ops(ops))
    }

    /// Applies the update to `doc`. `inserting` is true when building an upserted document
    /// (enables `$setOnInsert` and allows setting `_id`).
    pub(crate) fn apply(&self, doc: &mut Document, inserting: bool) -> Result<()> {
        let old_id = doc.get("_id").cloned();
        match self {
            Update::Replace(r) => {
                let mut new = Document::new();
                if let Some(id) = &old_id {
                    if let Some(rid) = r.get("_id") {
                        if !values_equal(rid, id) && !inserting {
                            return immutable_id();
                        }
                    }
                    new.insert("_id", id.clone());
                }
                for (k, v) in r {
                    if k == "_id" && new.contains_key("_id") {
                        continue;
                    }
                    new.insert(k.clone(), v.clone());
                }
                *doc = new;
            }
            Update::Ops(ops) => {
                for (op, path, arg) in ops {
                    apply_op(doc, op, path, arg, inserting)?;
                }
                if !inserting {
                    match (&old_id, doc.get("_id")) {
                        (Some(a), Some(b)) if values_equal(a, b) => {}
                        (None, None) => {}
                        _ => return immutable_id(),
                    }
                }
            }
        }
        Ok(())
    }
}

const KNOWN_OPS: &[&str] = &[
    "$set",
    "$unset",
    "$inc",
    "$mul",
    "$min",
    "$max",
    "$push",
    "$addToSet",
    "$pop",
    "$pull",
    "$pullAll",
    "$rename",
    "$setOnInsert",
    "$currentDate",
];

fn conflicts(a: &str, b: &str) -> bool {
    a == b
        || (a.len() > b.len() && a.starts_with(b) && a.as_bytes()[b.len()] == b'.')
        || (b.len() > a.len() && b.starts_with(a) && b.as_bytes()[a.len()] == b'.')
}

fn immutable_id<T>() -> Result<T> {
    uerr(
        66,
        "ImmutableField",
        "Performing an update on the path '_id' would modify the immutable field '_id'",
    )
}

pub(super) fn type_mismatch<T>(msg: String) -> Result<T> {
    uerr(14, "TypeMismatch", msg)
}

#[cfg(test)]
mod tests;
