//! Unit tests for update operators.

use super::*;
use bson::doc;
use bson::Bson;

fn up(d: Document, u: Document) -> Result<Document> {
    let mut d = d;
    Update::parse(&Bson::Document(u))?.apply(&mut d, false)?;
    Ok(d)
}

#[test]
fn operators() {
    let d = doc! {"_id": 1, "a": 1, "arr": [1, 2], "sub": {"x": 1}};
    assert_eq!(
        up(d.clone(), doc! {"$set": {"a": 5, "sub.y": 2, "n.m": true}}).unwrap(),
        doc! {"_id": 1, "a": 5, "arr": [1, 2], "sub": {"x": 1, "y": 2}, "n": {"m": true}}
    );
    assert_eq!(
        up(d.clone(), doc! {"$inc": {"a": 2, "b": 1.5}}).unwrap(),
        doc! {"_id": 1, "a": 3, "arr": [1, 2], "sub": {"x": 1}, "b": 1.5}
    );
    assert_eq!(
        up(d.clone(), doc! {"$unset": {"sub.x": "", "a": 1}}).unwrap(),
        doc! {"_id": 1, "arr": [1, 2], "sub": {}}
    );
    assert_eq!(
        up(d.clone(), doc! {"$push": {"arr": 3}})
            .unwrap()
            .get_array("arr")
            .unwrap()
            .len(),
        3
    );
    assert_eq!(
        up(
            d.clone(),
            doc! {"$push": {"arr": {"$each": [3, 4], "$slice": -3}}}
        )
        .unwrap()
        .get_array("arr")
        .unwrap(),
        &vec![Bson::Int32(2), Bson::Int32(3), Bson::Int32(4)]
    );
    assert_eq!(
        up(d.clone(), doc! {"$addToSet": {"arr": 2}})
            .unwrap()
            .get_array("arr")
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        up(d.clone(), doc! {"$pull": {"arr": {"$gte": 2}}})
            .unwrap()
            .get_array("arr")
            .unwrap(),
        &vec![Bson::Int32(1)]
    );
    assert_eq!(
        up(d.clone(), doc! {"$pop": {"arr": -1}})
            .unwrap()
            .get_array("arr")
            .unwrap(),
        &vec![Bson::Int32(2)]
    );
    assert_eq!(
        up(d.clone(), doc! {"$set": {"arr.3": 9}})
            .unwrap()
            .get_array("arr")
            .unwrap(),
        &vec![Bson::Int32(1), Bson::Int32(2), Bson::Null, Bson::Int32(9)]
    );
    assert_eq!(
        up(d.clone(), doc! {"$rename": {"a": "b"}}).unwrap(),
        doc! {"_id": 1, "arr": [1, 2], "sub": {"x": 1}, "b": 1}
    );
    assert_eq!(
        up(d.clone(), doc! {"$max": {"a": 7}, "$min": {"sub.x": 0}}).unwrap(),
        doc! {"_id": 1, "a": 7, "arr": [1, 2], "sub": {"x": 0}}
    );
    assert_eq!(
        up(d.clone(), doc! {"$inc": {"a": i32::MAX}})
            .unwrap()
            .get("a"),
        Some(&Bson::Int64(i32::MAX as i64 + 1))
    );
}

#[test]
fn replacement_and_errors() {
    let d = doc! {"_id": 1, "a": 1};
    assert_eq!(
        up(d.clone(), doc! {"b": 2}).unwrap(),
        doc! {"_id": 1, "b": 2}
    );
    assert_eq!(up(d.clone(), doc! {"_id": 2, "b": 2}).unwrap_err().code, 66);
    assert_eq!(
        up(d.clone(), doc! {"$set": {"_id": 2}}).unwrap_err().code,
        66
    );
    assert_eq!(up(d.clone(), doc! {"$foo": {"a": 1}}).unwrap_err().code, 9);
    assert_eq!(
        up(d.clone(), doc! {"$inc": {"a": "x"}}).unwrap_err().code,
        14
    );
    assert_eq!(
        up(d.clone(), doc! {"$set": {"a.b": 1}}).unwrap_err().code,
        28
    );
    assert_eq!(
        up(d.clone(), doc! {"$set": {"a": 1}, "$inc": {"a": 1}})
            .unwrap_err()
            .code,
        40
    );
    assert_eq!(up(d, doc! {"b": 1, "$set": {"a": 1}}).unwrap_err().code, 52);
    assert!(Update::parse(&Bson::Array(vec![])).is_err());
}

#[test]
fn upsert_seed() {
    let q = doc! {"a": 1, "b.c": "x", "d": {"$gt": 1}, "e": {"$eq": 5}, "$and": [{"f": 2}]};
    let mut s = seed_from_query(&q);
    assert_eq!(s, doc! {"a": 1, "b": {"c": "x"}, "e": 5, "f": 2});
    Update::parse(&Bson::Document(
        doc! {"$setOnInsert": {"g": 1}, "$set": {"h": 2}},
    ))
    .unwrap()
    .apply(&mut s, true)
    .unwrap();
    assert_eq!(s.get_i32("g").ok(), Some(1));
    assert_eq!(s.get_i32("h").ok(), Some(2));
}
