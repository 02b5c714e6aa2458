"""Tests of the soak's ledger check (check.py check) on made-up runs: it must fail on a lost, a
doubled and an unknown write, and attribute writes to the right store epoch.

Run: integration/.venv/bin/python -m pytest bench/soak/test_check.py
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def make_run(tmp_path, ledger, snaps, restarts):
    """ledger: [(status, id, t_send, t_done)]; snaps: [(t, [ids])] one per epoch, the last one
    final; restarts: [t] one per kill (a snapshot at snaps[i] precedes restart i)."""
    d = tmp_path
    events = [{"t": 0.0, "kind": "start"}]
    for i, (t, ids) in enumerate(snaps):
        name = f"snap-{i}.json"
        with open(d / name, "w") as f:
            json.dump({"t_start": t, "t_end": t + 0.1, "ids": {"ledger_a": ids}}, f)
        if i < len(restarts):
            events.append({"t": t, "kind": "snapshot", "file": name})
            events.append({"t": t + 0.5, "kind": "kill"})
            events.append({"t": restarts[i], "kind": "restart"})
        else:
            events.append({"t": t, "kind": "final-snapshot", "file": name})
    with open(d / "events.jsonl", "w") as f:
        f.write("".join(json.dumps(e) + "\n" for e in events))
    with open(d / "ledger-a.tsv", "w") as f:
        for status, _id, ts, td in ledger:
            f.write(f"{status}\t{_id}\t{ts}\t{td}\t\n")
    with open(d / "rss.tsv", "w") as f:
        f.write("t\tminute\ta\n0\t0\t1000\n60\t1\t1000\n")
    return d


def run_check(d):
    p = subprocess.run([sys.executable, os.path.join(HERE, "check.py"), "check", "--run-dir", str(d),
                        "--target", "a=ledger_a"], capture_output=True, text=True, timeout=60)
    verdict = json.load(open(d / "verdict.json")) if (d / "verdict.json").exists() else None
    return p.returncode, p.stdout + p.stderr, verdict


def test_clean_run_passes(tmp_path):
    d = make_run(tmp_path, [("ack", "x1", 1, 2), ("err", "x2", 3, 4), ("dup", "x3", 5, 6)],
                 [(10, ["x1", "x3"])], [])
    rc, out, v = run_check(d)
    assert rc == 0, out
    assert v["results"][0]["verified"] == 2
    assert "LEDGER: OK" in out


def test_lost_ack_fails(tmp_path):
    d = make_run(tmp_path, [("ack", "x1", 1, 2), ("ack", "x2", 3, 4)], [(10, ["x1"])], [])
    rc, out, v = run_check(d)
    assert rc == 1, out
    assert v["results"][0]["lost"] == 1


def test_doubled_doc_fails(tmp_path):
    d = make_run(tmp_path, [("ack", "x1", 1, 2)], [(10, ["x1", "x1"])], [])
    rc, out, v = run_check(d)
    assert rc == 1, out
    assert v["results"][0]["doubled"] == 1


def test_unknown_doc_fails(tmp_path):
    d = make_run(tmp_path, [("ack", "x1", 1, 2)], [(10, ["x1", "ghost"])], [])
    rc, out, v = run_check(d)
    assert rc == 1, out
    assert v["results"][0]["unknown"] == 1


def test_epochs(tmp_path):
    # Epoch 0: snapshot at 10, kill, restart at 12. Epoch 1: final snapshot at 30.
    ledger = [
        ("ack", "a", 1, 2),      # epoch 0, before the snapshot: must be in snap 0 (it is)
        ("ack", "b", 9, 11),     # after snapshot 0, before the restart: unverifiable
        ("ack", "c", 11, 13),    # sent before the restart, answered after: epoch 1 (it is)
        ("ack", "d", 14, 15),    # epoch 1 but only in the dead epoch-0 store: lost
    ]
    d = make_run(tmp_path, ledger, [(10, ["a", "b", "d"]), (30, ["c"])], [12])
    rc, out, v = run_check(d)
    r = v["results"][0]
    assert rc == 1, out
    assert (r["verified"], r["unverifiable"], r["lost"]) == (3, 1, 1), r
    assert r["lost_examples"][0][1] == "d"


def test_unfinished_run_is_an_error(tmp_path):
    d = make_run(tmp_path, [("ack", "x1", 1, 2)], [(10, ["x1"])], [])
    lines = open(d / "events.jsonl").read().splitlines()
    with open(d / "events.jsonl", "w") as f:
        f.write("\n".join(lines[:-1]) + "\n")
    rc, out, _ = run_check(d)
    assert rc != 0 and "final-snapshot" in out


def run_check_resume(d, limit):
    p = subprocess.run([sys.executable, os.path.join(HERE, "check.py"), "check", "--run-dir", str(d),
                        "--target", "a=ledger_a", "--resume-limit", str(limit)],
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def add_events(d, extra):
    lines = open(d / "events.jsonl").read().splitlines()
    final = lines.pop()
    lines += [json.dumps(e) for e in extra] + [final]
    with open(d / "events.jsonl", "w") as f:
        f.write("\n".join(lines) + "\n")


def test_resume_limit(tmp_path):
    # A step-down at 10; the next insert sent after it is acknowledged at 30 (20 s later).
    ledger = [("ack", "x1", 1, 2), ("err", "x2", 11, 16), ("ack", "x3", 25, 30)]
    d = make_run(tmp_path, ledger, [(100, ["x1", "x3"])], [])
    add_events(d, [{"t": 10.0, "kind": "stepdown", "new_primary": 1}, {"t": 90.0, "kind": "stop"}])
    rc, out = run_check_resume(d, 15)
    assert rc == 1 and "RESUME: FAIL (1 events)" in out, out
    rc, out = run_check_resume(d, 25)
    assert rc == 0 and "RESUME: OK" in out, out


def test_resume_never_near_the_end_is_not_counted(tmp_path):
    ledger = [("ack", "x1", 1, 2)]
    d = make_run(tmp_path, ledger, [(100, ["x1"])], [])
    add_events(d, [{"t": 85.0, "kind": "stepdown", "new_primary": 1}, {"t": 90.0, "kind": "stop"}])
    rc, out = run_check_resume(d, 15)
    assert rc == 0, out
    add_events(d, [{"t": 50.0, "kind": "stepdown", "new_primary": 2}])
    rc, out = run_check_resume(d, 15)
    assert rc == 1 and "never" in out, out
