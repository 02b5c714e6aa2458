"""The learned allowlist (rule A001), end to end with pymongo: the three steps of its workflow.

    python integration/allowlist.py learn   URI          # staging: mongoguard in learn mode
    python integration/allowlist.py review  FILE         # the file a pull request shows
    python integration/allowlist.py enforce URI          # production: enforce mode

run by integration/run_allowlist.sh, which starts and stops mongoguard between the steps
(learn mode writes the file at shutdown). "billing" sends two query shapes while learning;
in production those pass with other values, while the textbook NoSQL injection (an operator
where a literal was: {password: {$ne: null}} instead of {password: "x"}) is refused with
A001, and so is an application the file does not name (unknown_app = "enforce").
"""

import sys
import tomllib

import pymongo
from pymongo.errors import OperationFailure

BLOCK_CODE = 65001
FIND_SHAPE = 'find shop.users {"password": "<string>"}'
UPDATE_SHAPE = 'update shop.orders {"_id": "<int>"}'


def client(uri, app):
    return pymongo.MongoClient(
        uri, appName=app, directConnection=True, serverSelectionTimeoutMS=20000
    )


def billing(c, who, order):
    db = c["shop"]
    db.users.find_one({"password": who})
    db.orders.update_one({"_id": order}, {"$set": {"paid": True}})


def learn(uri):
    c = client(uri, "billing")
    for who, order in (("alice", 1), ("bob", 2)):
        billing(c, who, order)
    c.close()
    print("learn: billing sent its two query shapes")


def review(path):
    with open(path, "rb") as f:
        text = f.read()
    doc = tomllib.loads(text.decode())
    assert doc["version"] == 1, doc
    apps = {a["name"]: a.get("shapes", []) for a in doc.get("app", [])}
    assert "billing" in apps, f"billing is not in {path}:\n{text.decode()}"
    assert apps["billing"] == [FIND_SHAPE, UPDATE_SHAPE], apps["billing"]
    assert b"alice" not in text and b"bob" not in text, "literals in the file"
    print(f"review: {path} lists billing's shapes:")
    for s in apps["billing"]:
        print(f"    {s}")


def expect_blocked(fn, what):
    try:
        fn()
    except OperationFailure as e:
        assert e.code == BLOCK_CODE, (what, e.code, e.details)
        msg = e.details.get("errmsg", "")
        assert "A001 unknown-query-shape" in msg, (what, msg)
        assert not e.has_error_label("RetryableWriteError"), (what, e.details)
        print(f"enforce: {what}: blocked ({msg[:90]}...)")
        return
    raise AssertionError(f"{what} was not blocked")


def enforce(uri):
    c = client(uri, "billing")
    # The learned shapes pass, with values never seen while learning.
    billing(c, "carol", 3)
    print("enforce: billing's learned shapes pass")
    # The injection: the same find with an operator where a literal was.
    expect_blocked(
        lambda: c["shop"].users.find_one({"password": {"$ne": None}}),
        "find {password: {$ne: null}} from billing",
    )
    # The connection goes on.
    c["shop"].users.find_one({"password": "dave"})
    other = client(uri, "reports")
    expect_blocked(
        lambda: other["shop"].users.find_one({"password": "x"}),
        "find from reports (not in the file)",
    )
    other.close()
    c.close()


def main(argv):
    if len(argv) != 3 or argv[1] not in ("learn", "review", "enforce"):
        print(__doc__, file=sys.stderr)
        return 2
    {"learn": learn, "review": review, "enforce": enforce}[argv[1]](argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
