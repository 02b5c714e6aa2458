//! The rule registry: every rule of the pack, with its stable id, name, reason and the
//! default action of each shipped profile (documented in docs/rules.md). Ids never change meaning.

use super::Action;

/// A rule of the pack. The discriminant indexes per-rule arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum RuleId {
    W001,
    W002,
    W003,
    W004,
    W005,
    W006,
    W007,
    W008,
    W009,
    W010,
    W011,
    W012,
    W013,
    W014,
    W015,
    W016,
    Q001,
    Q002,
    Q003,
    Q004,
    Q005,
    Q006,
    Q007,
    Q008,
    I001,
    I002,
    I003,
    I004,
    D001,
    D002,
    D003,
    D004,
    D005,
    /// The learned allowlist (`[allowlist] mode = "enforce"`).
    A001,
    C001,
    C002,
    C003,
    /// Not a standard: the command could not be read, so it is refused (fail closed).
    G001,
}

/// Number of rules (size of per-rule arrays).
pub const RULE_COUNT: usize = RuleId::G001 as usize + 1;

/// Static facts about a rule.
#[derive(Debug)]
pub struct RuleInfo {
    /// The rule.
    pub id: RuleId,
    /// `"W001"`.
    pub code: &'static str,
    /// `"multi-update-without-filter"`.
    pub name: &'static str,
    /// One line, for the violation record and the error the client sees.
    pub reason: &'static str,
    /// What to do instead, in a few words: the end of every errmsg that names the rule, and
    /// the README rule table's last column.
    pub remedy: &'static str,
    /// Default in `standard`.
    pub standard: Action,
    /// Default in `strict`.
    pub strict: Action,
    /// False for rules that need facts from the upstream or the shard config (not built yet):
    /// they can be configured but never fire.
    pub implemented: bool,
    /// What the rule judges: one command, or how an application connects.
    pub scope: Scope,
}

/// What a rule judges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// One command: evaluated per request; may block.
    Command,
    /// How an application connects (connection standards): assessed per application from
    /// its connections, reported periodically, never per command; `off` or `warn` only.
    Connection,
}

use Action::{Block as B, Off as O, Warn as W};

macro_rules! rule {
    ($id:ident, $name:literal, $reason:literal, $remedy:literal, $std:expr, $strict:expr) => {
        rule!($id, $name, $reason, $remedy, $std, $strict, true)
    };
    ($id:ident, $name:literal, $reason:literal, $remedy:literal, $std:expr, $strict:expr, $impl:expr) => {
        RuleInfo {
            id: RuleId::$id,
            code: stringify!($id),
            name: $name,
            reason: $reason,
            remedy: $remedy,
            standard: $std,
            strict: $strict,
            implemented: $impl,
            scope: Scope::Command,
        }
    };
}

/// A connection standard: reported per application, never evaluated per command.
macro_rules! conn_rule {
    ($id:ident, $name:literal, $reason:literal, $remedy:literal, $std:expr, $strict:expr) => {
        RuleInfo {
            id: RuleId::$id,
            code: stringify!($id),
            name: $name,
            reason: $reason,
            remedy: $remedy,
            standard: $std,
            strict: $strict,
            implemented: true,
            scope: Scope::Connection,
        }
    };
}

/// Every rule, in `RuleId` order.
pub static RULES: [RuleInfo; RULE_COUNT] = [
    rule!(W001, "multi-update-without-filter", "a multi-document update whose filter matches every document rewrites the whole collection", "filter on the documents to change (by _id or an indexed field), or update in batches by _id", B, B),
    rule!(W002, "update-without-filter", "a single-document update whose filter matches every document modifies an arbitrary document", "filter on the one document to change, by _id or a unique key", W, B),
    rule!(W003, "delete-many-without-filter", "a multi-document delete whose filter matches every document empties the collection", "filter on the documents to delete; to empty a collection, drop it or use a TTL index", B, B),
    rule!(W004, "delete-many", "bulk removes load the server; prefer a TTL index, drop, or a throttled job", "use a TTL index, drop the collection, or delete in throttled batches by _id", W, W),
    rule!(W005, "system-namespace-write", "writes into admin, local, config or system.* collections can break the deployment", "write to an application database; leave admin, local, config and system.* to operators", B, B),
    rule!(W006, "journal-disabled", "a write concern with j:false acknowledges writes that a crash can lose", "use j:true or leave j out (the server's default)", B, B),
    rule!(W007, "unacknowledged-write", "an unacknowledged write (w:0 or moreToCome) hides every error from the application", "use w:1 or w:\"majority\" and handle the errors", W, B),
    rule!(W008, "drop-database", "dropDatabase destroys every collection of the database", "drop the collections you mean to, in a reviewed migration", W, B),
    rule!(W009, "rename-collection", "renameCollection breaks every reader of the old name and locks the database", "write to a new collection and move readers over, or use a view", W, W),
    rule!(W010, "whole-document-replace", "a whole-document replacement is a read-modify-write race; prefer $set", "update with $set on the fields that change", O, W),
    rule!(W011, "unbounded-array-push", "$push without $slice grows arrays towards the 16 MB document limit", "use $push with $each and $slice, or keep the items in their own collection", W, W),
    rule!(W012, "large-multi-write", "a multi-document write measured to match more than max_docs documents; prefer batches, a TTL index, or drop", "write in batches of at most max_docs documents, or use a TTL index or drop", W, B),
    rule!(W013, "server-administration", "this command changes the server for every client (write concern defaults, parameters, profiling, locks, shutdown, replica-set or sharding administration, applyOps)", "leave server administration to operators (mongosh with an admin role)", B, B),
    rule!(W014, "drop-collection", "drop destroys a collection of an application database and every index on it", "drop collections in a reviewed migration, not from the application", W, B),
    rule!(W015, "collection-overwrite", "this write replaces or truncates a whole collection ($out, $merge replacing documents, mapReduce replace, rename with dropTarget, convertToCapped)", "write to a new collection and switch readers, or $merge with whenMatched: \"merge\"", W, B),
    rule!(W016, "ttl-expire-now", "a TTL below 60 seconds deletes documents almost as soon as they are written (0 deletes every document with the field)", "use expireAfterSeconds of 60 or more", W, B),
    rule!(Q001, "negation-operator", "$ne, $nin and $not cannot use an index well; rewrite as $in", "rewrite the negation as $in of the values you want", W, W),
    rule!(Q002, "server-side-javascript", "server-side JavaScript ($where, $function, $accumulator, mapReduce) is slow and unsafe", "use aggregation operators instead of JavaScript", W, B),
    rule!(Q003, "unanchored-regex", "an unanchored or case-insensitive regex scans every index key", "anchor the regex with ^ and query a lowercased copy instead of the i flag", W, W),
    rule!(Q004, "exists-false", "{$exists: false} cannot use an index efficiently", "store an explicit value (null or a flag) and query it by equality", W, W),
    rule!(Q005, "large-in-or", "very long $in/$nin lists or $or branches make plans slow and unstable", "split the query into smaller $in/$or lists, or restructure the data", W, W),
    rule!(Q006, "collection-scan", "the upstream's plan for this query shape is a collection scan", "add an index for this query shape and check it with explain", W, W),
    rule!(Q007, "in-memory-sort", "the upstream's plan for this query shape sorts in memory", "add an index whose key order matches the sort", W, W),
    rule!(Q008, "query-without-shard-key", "a query on a sharded collection without its shard key goes to every shard", "include the shard key (equality or $in) in the filter", O, W),
    rule!(I001, "foreground-index-build", "before MongoDB 4.2 an index built without background:true blocks the database", "build with background:true, or upgrade to MongoDB 4.2+", W, B),
    rule!(I002, "too-many-indexes", "every index slows every write; keep collections under 10 indexes", "drop unused indexes (see $indexStats) and stay under 10", B, B),
    rule!(I003, "ttl-on-compound-index", "the TTL monitor ignores expireAfterSeconds on a compound index", "put the TTL on a single-field index", W, B),
    rule!(I004, "range-shard-on-monotonic-key", "a range shard key on _id sends every insert to one shard; use hashed", "shard on {_id: \"hashed\"} or on a key that does not grow monotonically", W, B),
    rule!(D001, "document-too-large", "large documents are slow to read, write and replicate", "split the document; keep large data in GridFS or its own collection", W, W),
    rule!(D002, "deep-nesting", "deeply nested documents are hard to index and query", "flatten the document to a few levels", W, W),
    rule!(D003, "large-array", "very large arrays make updates and indexes expensive", "bound the array, or move its items to their own collection", W, W),
    rule!(D004, "random-id", "string or UUID _id values are random keys that split B-tree pages; prefer ObjectId", "use ObjectId _ids and keep the string or UUID as an indexed field", W, W),
    rule!(D005, "naming-convention", "database names must be db_<lowercase>, collection names t_<lowercase>", "name databases db_name and collections t_name, in lowercase", O, W),
    rule!(A001, "unknown-query-shape", "this application never sent this query shape while the allowlist was learned: a new deploy, or an injection", "if the shape is intended, learn it again (allowlist.mode = \"learn\") and review the allowlist file", O, O),
    conn_rule!(C001, "short-lived-connections", "an application opening many connections a minute with few requests each keeps no connection pool: every request pays a TCP, TLS and authentication handshake", "create one client per process and reuse it (a connection pool), or enable persistent connections", W, W),
    conn_rule!(C002, "missing-app-name", "a client whose handshake names no application (appName): nothing it does can be attributed", "set appName in the connection string (appName=my-service)", W, W),
    conn_rule!(C003, "outdated-driver", "the driver is older than the minimum version configured for its name", "upgrade the driver to the configured minimum version or later", O, W),
    rule!(G001, "unreadable-command", "mongoguard cannot tell what this command does, so it refuses it (fail closed)", "send a well-formed command, as a current driver does", B, B),
];

/// Never used while RULES is complete (a unit test checks it); it keeps `info()` total.
static UNKNOWN_RULE: RuleInfo = RuleInfo {
    id: RuleId::G001,
    code: "G001",
    name: "unreadable-command",
    reason: "mongoguard cannot tell what this command does, so it refuses it (fail closed)",
    remedy: "send a well-formed command, as a current driver does",
    standard: Action::Block,
    strict: Action::Block,
    implemented: true,
    scope: Scope::Command,
};

impl RuleId {
    /// Static facts.
    pub fn info(self) -> &'static RuleInfo {
        // RULES is `[RuleInfo; RULE_COUNT]` and RULE_COUNT is the last id plus one, so every id
        // has an entry (the unit test `registry_is_in_id_order_and_codes_are_unique` checks the order).
        match RULES.get(self as usize) {
            Some(info) => info,
            None => &UNKNOWN_RULE,
        }
    }

    /// `"W001"`.
    pub fn code(self) -> &'static str {
        self.info().code
    }

    /// True for the connection standards (C001–C003), which are assessed per application,
    /// never per command.
    pub fn is_connection(self) -> bool {
        self.info().scope == Scope::Connection
    }

    /// Looks a rule up by its code.
    pub fn from_code(code: &str) -> Option<RuleId> {
        RULES.iter().find(|r| r.code == code).map(|r| r.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_is_in_id_order_and_codes_are_unique() {
        for (i, r) in RULES.iter().enumerate() {
            assert_eq!(r.id as usize, i, "{}", r.code);
            assert_eq!(RuleId::from_code(r.code), Some(r.id));
            assert!(!r.reason.contains('\n'));
            assert!(
                !r.remedy.is_empty() && !r.remedy.contains('\n'),
                "{}",
                r.code
            );
            assert!(r.remedy.len() <= 100, "{}: a remedy is a few words", r.code);
        }
    }

    /// The README's rule table has one row per rule, with its name and, in the last column,
    /// the same remedy the errmsg ends with: the two cannot drift apart.
    #[test]
    fn readme_rule_table_matches_the_registry() {
        let readme = include_str!("../../README.md");
        for r in RULES.iter() {
            let start = format!("| {} | {} | ", r.code, r.name);
            let row = readme
                .lines()
                .find(|l| l.starts_with(&start))
                .unwrap_or_else(|| panic!("README has no row for {}", r.code));
            let remedy = r.remedy.replace('|', "\\|");
            assert!(
                row.ends_with(&format!("| {remedy} |")),
                "README row of {} does not end with its remedy {remedy:?}: {row}",
                r.code
            );
            assert!(
                !r.remedy.contains('<'),
                "{}: markdown would eat <...>",
                r.code
            );
        }
    }
}
