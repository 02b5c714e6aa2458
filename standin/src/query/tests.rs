//! Unit tests for query.

use super::*;
use bson::doc;

fn m(filter: Document, d: Document) -> bool {
    Filter::parse(&filter).unwrap().matches(&d)
}

#[test]
fn equality_paths_and_arrays() {
    let d = doc! {"a": 1, "b": {"c": "x", "d": [1, 2, 3]}, "tags": ["red", "blue"],
    "items": [{"k": 1, "v": "one"}, {"k": 2, "v": "two"}], "n": null};
    assert!(m(doc! {"a": 1.0}, d.clone()));
    assert!(m(doc! {"a": 1i64}, d.clone()));
    assert!(!m(doc! {"a": 2}, d.clone()));
    assert!(m(doc! {"b.c": "x"}, d.clone()));
    assert!(m(doc! {"b.d": 2}, d.clone()));
    assert!(m(doc! {"b.d": [1, 2, 3]}, d.clone()));
    assert!(m(doc! {"tags": "blue"}, d.clone()));
    assert!(m(doc! {"items.k": 2}, d.clone()));
    assert!(m(doc! {"items.1.v": "two"}, d.clone()));
    assert!(m(doc! {"b": {"c": "x", "d": [1, 2, 3]}}, d.clone()));
    assert!(!m(doc! {"b": {"c": "x"}}, d.clone()));
    assert!(m(doc! {"missing": null}, d.clone()));
    assert!(m(doc! {"n": null}, d.clone()));
    assert!(!m(doc! {"a": null}, d.clone()));
    assert!(m(doc! {}, d));
}

#[test]
fn operators() {
    let d =
        doc! {"x": 5, "s": "Hello", "arr": [1, 5, 9], "sub": [{"a": 1, "b": 2}, {"a": 3, "b": 4}]};
    assert!(m(doc! {"x": {"$gt": 4, "$lte": 5}}, d.clone()));
    assert!(!m(doc! {"x": {"$gt": 5}}, d.clone()));
    assert!(!m(doc! {"x": {"$gt": "a"}}, d.clone()));
    assert!(m(doc! {"x": {"$in": [1, 5]}}, d.clone()));
    assert!(m(doc! {"x": {"$nin": [1, 2]}}, d.clone()));
    assert!(m(doc! {"x": {"$ne": 4}}, d.clone()));
    assert!(!m(doc! {"arr": {"$ne": 5}}, d.clone()));
    assert!(m(doc! {"y": {"$exists": false}}, d.clone()));
    assert!(m(doc! {"x": {"$exists": true}}, d.clone()));
    assert!(m(
        doc! {"s": {"$regex": "^hel", "$options": "i"}},
        d.clone()
    ));
    assert!(!m(doc! {"s": {"$regex": "^hel"}}, d.clone()));
    let lit = bson::Regex {
        pattern: "l+o$".try_into().unwrap(),
        options: "".try_into().unwrap(),
    };
    assert!(m(doc! {"s": lit}, d.clone()));
    assert!(m(doc! {"$or": [{"x": 1}, {"s": "Hello"}]}, d.clone()));
    assert!(!m(doc! {"$nor": [{"x": 1}, {"s": "Hello"}]}, d.clone()));
    assert!(m(doc! {"$and": [{"x": 5}, {"s": "Hello"}]}, d.clone()));
    assert!(m(doc! {"x": {"$not": {"$gt": 6}}}, d.clone()));
    assert!(m(doc! {"arr": {"$elemMatch": {"$gt": 8}}}, d.clone()));
    assert!(m(doc! {"sub": {"$elemMatch": {"a": 3, "b": 4}}}, d.clone()));
    assert!(!m(
        doc! {"sub": {"$elemMatch": {"a": 1, "b": 4}}},
        d.clone()
    ));
    assert!(m(doc! {"arr": {"$size": 3}}, d.clone()));
    assert!(m(doc! {"arr": {"$all": [1, 9]}}, d.clone()));
    assert!(m(doc! {"x": {"$type": "number"}}, d.clone()));
    assert!(m(doc! {"s": {"$type": "string"}}, d.clone()));
    assert!(m(doc! {"x": {"$mod": [2, 1]}}, d.clone()));
    assert!(m(doc! {"arr": {"$gt": 8}}, d));
}

#[test]
fn unsupported_is_an_error() {
    assert!(Filter::parse(&doc! {"$where": "1"}).is_err());
    assert!(Filter::parse(&doc! {"$expr": {"$eq": ["$a", 1]}}).is_err());
    assert!(Filter::parse(&doc! {"a": {"$near": [0, 0]}}).is_err());
    assert!(Filter::parse(&doc! {"a": {"$regex": "("}}).is_err());
    assert!(Filter::parse(&doc! {"$or": []}).is_err());
}

#[test]
fn id_fast_path() {
    let f = Filter::parse(&doc! {"_id": 5}).unwrap();
    assert_eq!(f.id_equality(), Some(&Bson::Int32(5)));
    assert!(Filter::parse(&doc! {"_id": 5, "a": 1})
        .unwrap()
        .id_equality()
        .is_none());
    assert!(Filter::parse(&doc! {"_id": {"$gt": 5}})
        .unwrap()
        .id_equality()
        .is_none());
}
