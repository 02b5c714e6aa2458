//! Projections (inclusion / exclusion, dotted paths, `_id` handling) and sort specifications.

use std::cmp::Ordering;

use bson::{Bson, Document};

use crate::bsonutil::{as_f64, compare, truthy};
use crate::query::{collect_doc, QueryError};

type Result<T> = std::result::Result<T, QueryError>;

#[derive(Debug, Clone, Default)]
pub(crate) struct Tree(Vec<(String, Node)>);

#[derive(Debug, Clone)]
pub(crate) enum Node {
    Leaf,
    Sub(Tree),
}

impl Tree {
    fn get(&self, k: &str) -> Option<&Node> {
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v)
    }

    fn add(&mut self, path: &[&str]) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        let pos = self.0.iter().position(|(n, _)| n == first);
        if rest.is_empty() {
            match pos {
                Some(i) => self.0[i].1 = Node::Leaf,
                None => self.0.push((first.to_string(), Node::Leaf)),
            }
            return;
        }
        let i = match pos {
            Some(i) => i,
            None => {
                self.0.push((first.to_string(), Node::Sub(Tree::default())));
                self.0.len() - 1
            }
        };
        if let Node::Sub(t) = &mut self.0[i].1 {
            t.add(rest);
        }
    }
}

/// A compiled projection.
#[derive(Debug, Clone)]
pub(crate) enum Projection {
    /// Return whole documents.
    All,
    Include {
        tree: Tree,
        id: bool,
    },
    Exclude {
        tree: Tree,
        id: bool,
    },
}

impl Projection {
    pub(crate) fn parse(spec: Option<&Document>) -> Result<Projection> {
        let Some(spec) = spec.filter(|s| !s.is_empty()) else {
            return Ok(Projection::All);
        };
        let mut include = Tree::default();
        let mut exclude = Tree::default();
        let mut id: Option<bool> = None;
        for (k, v) in spec {
            if !matches!(
                v,
                Bson::Boolean(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_)
            ) {
                return Err(QueryError(format!(
                    "projection of '{k}' uses an expression or operator, not supported by the mongoguard stand-in"
                )));
            }
            if k.contains('$') {
                return Err(QueryError(format!(
                    "positional projection '{k}' is not supported by the mongoguard stand-in"
                )));
            }
            let on = truthy(v);
            if k == "_id" {
                id = Some(on);
                continue;
            }
            let parts: Vec<&str> = k.split('.').collect();
            if on {
                include.add(&parts);
            } else {
                exclude.add(&parts);
            }
        }
        match (include.0.is_empty(), exclude.0.is_empty()) {
            (false, false) => Err(QueryError(format!(
                "Cannot do exclusion on field {} in inclusion projection",
                exclude.0[0].0
            ))),
            (false, true) => Ok(Projection::Include {
                tree: include,
                id: id.unwrap_or(true),
            }),
            (true, false) => Ok(Projection::Exclude {
                tree: exclude,
                id: id.unwrap_or(true),
            }),
            (true, true) => match id {
                Some(false) => Ok(Projection::Exclude {
                    tree: Tree::default(),
                    id: false,
                }),
                _ => Ok(Projection::Include {
                    tree: Tree::default(),
                    id: true,
                }),
            },
        }
    }

    pub(crate) fn is_all(&self) -> bool {
        matches!(self, Projection::All)
    }

    pub(crate) fn apply(&self, doc: &Document) -> Document {
        match self {
            Projection::All => doc.clone(),
            Projection::Include { tree, id } => {
                let mut out = Document::new();
                if *id && tree.get("_id").is_none() {
                    if let Some(v) = doc.get("_id") {
                        out.insert("_id", v.clone());
                    }
                }
                include_into(doc, tree, &mut out);
                out
            }
            Projection::Exclude { tree, id } => {
                let mut out = exclude(doc, tree);
                if !*id {
                    out.remove("_id");
                }
                out
            }
        }
    }
}

fn include_into(doc: &Document, tree: &Tree, out: &mut Document) {
    for (k, v) in doc {
        match tree.get(k) {
            None => {}
            Some(Node::Leaf) => {
                out.insert(k.clone(), v.clone());
            }
            Some(Node::Sub(t)) => match v {
                Bson::Document(d) => {
                    let mut sub = Document::new();
                    include_into(d, t, &mut sub);
                    out.insert(k.clone(), sub);
                }
                Bson::Array(a) => {
                    let items: Vec<Bson> = a
                        .iter()
                        .filter_map(|e| match e {
                            Bson::Document(d) => {
                                let mut sub = Document::new();
                                include_into(d, t, &mut sub);
                                Some(Bson::Document(sub))
                            }
                            _ => None,
                        })
                        .collect();
                    out.insert(k.clone(), items);
                }
                _ => {}
            },
        }
    }
}

fn exclude(doc: &Document, tree: &Tree) -> Document {
    let mut out = Document::new();
    for (k, v) in doc {
        match tree.get(k) {
            None => {
                out.insert(k.clone(), v.clone());
            }
            Some(Node::Leaf) => {}
            Some(Node::Sub(t)) => {
                let nv = match v {
                    Bson::Document(d) => Bson::Document(exclude(d, t)),
                    Bson::Array(a) => Bson::Array(
                        a.iter()
                            .map(|e| match e {
                                Bson::Document(d) => Bson::Document(exclude(d, t)),
                                other => other.clone(),
                            })
                            .collect(),
                    ),
                    other => other.clone(),
                };
                out.insert(k.clone(), nv);
            }
        }
    }
    out
}

/// A compiled sort specification.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sort(Vec<(Vec<String>, bool)>);

impl Sort {
    pub(crate) fn parse(spec: Option<&Document>) -> Result<Sort> {
        let Some(spec) = spec else {
            return Ok(Sort::default());
        };
        let mut keys = Vec::new();
        for (k, v) in spec {
            let dir = match as_f64(v) {
                Some(f) if f > 0.0 => false,
                Some(f) if f < 0.0 => true,
                _ => {
                    return Err(QueryError(format!(
                        "bad sort specification for '{k}' (only 1 / -1 are supported by the mongoguard stand-in)"
                    )))
                }
            };
            keys.push((k.split('.').map(str::to_string).collect(), dir));
        }
        Ok(Sort(keys))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn key(&self, doc: &Document) -> Vec<Bson> {
        self.0
            .iter()
            .map(|(path, desc)| {
                let null = Bson::Null;
                let mut cands = Vec::new();
                collect_doc(doc, path, &mut cands);
                let mut vals: Vec<&Bson> = Vec::with_capacity(cands.len());
                for c in &cands {
                    match c {
                        None => vals.push(&null),
                        Some(Bson::Array(a)) if !a.is_empty() => vals.extend(a.iter()),
                        Some(v) => vals.push(v),
                    }
                }
                let best = if *desc {
                    vals.into_iter().max_by(|a, b| compare(a, b))
                } else {
                    vals.into_iter().min_by(|a, b| compare(a, b))
                };
                best.cloned().unwrap_or(Bson::Null)
            })
            .collect()
    }

    fn cmp_keys(&self, a: &[Bson], b: &[Bson]) -> Ordering {
        for ((x, y), (_, desc)) in a.iter().zip(b.iter()).zip(self.0.iter()) {
            let o = compare(x, y);
            let o = if *desc { o.reverse() } else { o };
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    }

    /// Sorts in place (stable).
    pub(crate) fn sort(&self, docs: &mut Vec<Document>) {
        if self.0.is_empty() || docs.len() < 2 {
            return;
        }
        let mut pairs: Vec<((), Document)> =
            std::mem::take(docs).into_iter().map(|d| ((), d)).collect();
        self.sort_pairs(&mut pairs);
        docs.extend(pairs.into_iter().map(|(_, d)| d));
    }

    /// Sorts `(tag, document)` pairs by their documents (stable).
    pub(crate) fn sort_pairs<T>(&self, items: &mut Vec<(T, Document)>) {
        if self.0.is_empty() || items.len() < 2 {
            return;
        }
        let mut keyed: Vec<(Vec<Bson>, (T, Document))> = std::mem::take(items)
            .into_iter()
            .map(|p| (self.key(&p.1), p))
            .collect();
        keyed.sort_by(|a, b| self.cmp_keys(&a.0, &b.0));
        items.extend(keyed.into_iter().map(|(_, p)| p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn p(spec: Document, d: &Document) -> Document {
        Projection::parse(Some(&spec)).unwrap().apply(d)
    }

    #[test]
    fn projections() {
        let d = doc! {"_id": 1, "a": 1, "b": {"c": 2, "d": 3}, "e": [{"f": 1, "g": 2}, 5]};
        assert_eq!(p(doc! {"a": 1}, &d), doc! {"_id": 1, "a": 1});
        assert_eq!(p(doc! {"a": 1, "_id": 0}, &d), doc! {"a": 1});
        assert_eq!(p(doc! {"b.c": 1}, &d), doc! {"_id": 1, "b": {"c": 2}});
        assert_eq!(p(doc! {"e.f": true}, &d), doc! {"_id": 1, "e": [{"f": 1}]});
        assert_eq!(p(doc! {"b": 0, "e": 0}, &d), doc! {"_id": 1, "a": 1});
        assert_eq!(
            p(doc! {"b.d": 0, "_id": 0}, &d),
            doc! {"a": 1, "b": {"c": 2}, "e": [{"f": 1, "g": 2}, 5]}
        );
        assert_eq!(p(doc! {"_id": 0}, &d).get("_id"), None);
        assert_eq!(p(doc! {"_id": 1}, &d), doc! {"_id": 1});
        assert!(Projection::parse(Some(&doc! {"a": 1, "b": 0})).is_err());
        assert!(Projection::parse(Some(&doc! {"a": {"$slice": 1}})).is_err());
    }

    #[test]
    fn sorting() {
        let mut docs = vec![
            doc! {"_id": 1, "a": 2, "b": "x"},
            doc! {"_id": 2, "a": 1.5, "b": "y"},
            doc! {"_id": 3, "b": "z"},
            doc! {"_id": 4, "a": 2i64, "b": "a"},
            doc! {"_id": 5, "a": "str"},
        ];
        Sort::parse(Some(&doc! {"a": 1, "b": -1}))
            .unwrap()
            .sort(&mut docs);
        let ids: Vec<i32> = docs.iter().map(|d| d.get_i32("_id").unwrap()).collect();
        assert_eq!(ids, vec![3, 2, 1, 4, 5]);
        Sort::parse(Some(&doc! {"a": -1})).unwrap().sort(&mut docs);
        let ids: Vec<i32> = docs.iter().map(|d| d.get_i32("_id").unwrap()).collect();
        assert_eq!(ids, vec![5, 1, 4, 2, 3]);
        let mut arr = vec![doc! {"_id": 1, "v": [5, 1]}, doc! {"_id": 2, "v": [3]}];
        Sort::parse(Some(&doc! {"v": 1})).unwrap().sort(&mut arr);
        assert_eq!(arr[0].get_i32("_id").unwrap(), 1);
        Sort::parse(Some(&doc! {"v": -1})).unwrap().sort(&mut arr);
        assert_eq!(arr[0].get_i32("_id").unwrap(), 1);
        assert!(Sort::parse(Some(&doc! {"a": {"$meta": "textScore"}})).is_err());
    }
}
