"""pymongo through mongoguard's TLS listener (set up by integration/run_local.sh with
throwaway openssl certificates): CRUD over TLS with the CA verified, and the clean failures
of a client that trusts another CA or does not speak TLS at all.

Environment (from run_local.sh; the module is skipped without MONGOGUARD_TLS_PORT, and fails
instead under CI=true so CI cannot silently lose it):
  MONGOGUARD_TLS_PORT      port of the TLS-listening mongoguard on 127.0.0.1
  MONGOGUARD_TLS_CA        the CA that signed its certificate (names localhost, 127.0.0.1)
  MONGOGUARD_TLS_OTHER_CA  an unrelated CA
"""

import os
import uuid

import pytest
from pymongo import MongoClient
from pymongo.errors import ServerSelectionTimeoutError

if not os.environ.get("MONGOGUARD_TLS_PORT"):
    if os.environ.get("CI") == "true":
        raise RuntimeError("MONGOGUARD_TLS_PORT must be set in CI (run integration/run_local.sh)")
    pytest.skip("TLS suite: MONGOGUARD_TLS_PORT is not set", allow_module_level=True)

PORT = os.environ["MONGOGUARD_TLS_PORT"]
CA = os.environ["MONGOGUARD_TLS_CA"]
OTHER_CA = os.environ["MONGOGUARD_TLS_OTHER_CA"]


def client(host="localhost", **kw):
    kw.setdefault("serverSelectionTimeoutMS", 3000)
    kw.setdefault("connectTimeoutMS", 3000)
    return MongoClient(f"mongodb://{host}:{PORT}/", **kw)


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_crud_over_tls(host):
    with client(host, tls=True, tlsCAFile=CA) as c:
        coll = c.tlsdb[f"c{uuid.uuid4().hex[:8]}"]
        coll.insert_many([{"i": i} for i in range(200)])
        assert coll.count_documents({}) == 200
        assert len(list(coll.find({"i": {"$gte": 0}}, batch_size=50))) == 200
        hello = c.admin.command("hello")
        assert "hosts" not in hello


def test_untrusted_ca_is_refused():
    with client(tls=True, tlsCAFile=OTHER_CA) as c:
        with pytest.raises(ServerSelectionTimeoutError) as e:
            c.admin.command("ping")
    msg = str(e.value).lower()
    assert "certificate" in msg or "ssl" in msg, msg


def test_plaintext_client_is_refused_cleanly():
    with client(tls=False) as c:
        with pytest.raises(ServerSelectionTimeoutError):
            c.admin.command("ping")
    # The listener keeps serving TLS clients afterwards.
    with client(tls=True, tlsCAFile=CA) as c:
        assert c.admin.command("ping")["ok"] == 1.0
