// The Node driver through mongoguard in pooled mode: the scenarios of
// integration/python/test_pooled.py. Clients authenticate to mongoguard (SCRAM, users file);
// their commands run on a small pool of upstream connections mongoguard authenticated itself.
// mongoguard answers hello itself, as a mongos ("isdbgrid").
//
// Environment (set by integration/run_node.sh):
//   MONGOGUARD_POOLED_ADDR      host:port of mongoguard in pooled mode
//   MONGOGUARD_POOLED_USER      a user of mongoguard's users file (auth db admin)
//   MONGOGUARD_POOLED_PASSWORD  its password
//   MONGOGUARD_STANDIN_ADDR     host:port of the mongoguard-standin behind it ({standinStats: 1})
//   MONGOGUARD_POOL_SIZE        mongoguard's [pool] pool_size (default 4)
//   MONGOGUARD_STANDIN_URI      optional: mongodb:// URI of the stand-in with the upstream
//                               credentials, to check stored data behind mongoguard's back
// Without the first four the suite skips itself, unless CI=true (then it fails).

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { MongoClient, MongoServerError } from 'mongodb';
// The driver's internal connection class (no "exports" map restricts deep imports in 6.x).
import { Connection } from 'mongodb/lib/cmap/connection.js';
import {
  AUTH_FAILED,
  BLOCK_CODE,
  UNAUTHORIZED,
  Watch,
  assertBlocked,
  directClient,
  runLimited,
  standinStats,
  suiteEnv,
  uniqueDb,
  upstreamDelta,
} from '../lib/common.mjs';

const { env, skip, failure } = suiteEnv(
  'pooled-mode suite',
  ['MONGOGUARD_POOLED_ADDR', 'MONGOGUARD_POOLED_USER', 'MONGOGUARD_POOLED_PASSWORD', 'MONGOGUARD_STANDIN_ADDR'],
  'integration/run_node.sh',
);
const ADDR = env.MONGOGUARD_POOLED_ADDR;
const USER = env.MONGOGUARD_POOLED_USER;
const PASSWORD = env.MONGOGUARD_POOLED_PASSWORD;
const STANDIN_ADDR = env.MONGOGUARD_STANDIN_ADDR;
const STANDIN_URI = process.env.MONGOGUARD_STANDIN_URI || '';
const POOL_SIZE = Number(process.env.MONGOGUARD_POOL_SIZE || '4');

const CHURN_CLIENTS = 300;
const CHURN_CONCURRENCY = 50;

// Generous client timeouts: a debug build under 50 concurrent handshakes can be slow.
const CLIENT_OPTS = {
  serverSelectionTimeoutMS: 60000,
  connectTimeoutMS: 30000,
  socketTimeoutMS: 120000,
  waitQueueTimeoutMS: 120000,
};

function proxyUri({ user = USER, password = PASSWORD, query = {} } = {}) {
  let cred = '';
  const opts = {};
  if (user !== null) {
    cred = `${encodeURIComponent(user)}:${encodeURIComponent(password ?? '')}@`;
    opts.authSource = 'admin';
  }
  Object.assign(opts, query);
  const qs = new URLSearchParams(opts).toString();
  return `mongodb://${cred}${ADDR}/${qs ? `?${qs}` : ''}`;
}

function proxyClient({ user, password, query, ...opts } = {}) {
  return new MongoClient(proxyUri({ user, password, query }), { ...CLIENT_OPTS, ...opts });
}

async function withClient(client, fn) {
  try {
    return await fn(client);
  } finally {
    await client.close();
  }
}

async function expectError(op) {
  try {
    await op();
  } catch (err) {
    return err;
  }
  assert.fail('expected an error');
}

describe('pooled: Node driver through mongoguard in pooled mode', () => {
  if (failure) {
    test('environment', () => assert.fail(failure));
    return;
  }
  if (skip) {
    test('environment', { skip }, () => {});
    return;
  }

  const newDb = (tag) => uniqueDb('mgt_node_pooled', tag);

  async function dropDb(name) {
    if (!STANDIN_URI) return; // the stand-in is in-memory and per run
    const direct = directClient(STANDIN_URI);
    try {
      await direct.db(name).dropDatabase();
    } catch {
      // best effort
    } finally {
      await direct.close();
    }
  }

  test('hello is answered as a mongos', async () => {
    await withClient(proxyClient(), async (c) => {
      const hello = await c.db('admin').command({ hello: 1 });
      assert.equal(hello.msg, 'isdbgrid', JSON.stringify(hello));
      assert.ok(!('hosts' in hello) && !('setName' in hello), JSON.stringify(hello));
      assert.ok(!('topologyVersion' in hello), 'no topologyVersion: the driver polls hello');
      assert.equal(hello.isWritablePrimary, true);
      assert.ok(hello.maxWireVersion >= 8, `maxWireVersion ${hello.maxWireVersion}`);
      assert.equal(c.topology.description.type, 'Sharded', `topology ${c.topology.description.type}`);
    });
  });

  test('hello without credentials', async () => {
    await withClient(proxyClient({ user: null }), async (c) => {
      const hello = await c.db('admin').command({ hello: 1 });
      assert.equal(hello.msg, 'isdbgrid');
    });
  });

  for (const mechanism of ['SCRAM-SHA-256', 'SCRAM-SHA-1']) {
    test(`SCRAM login with ${mechanism}`, async () => {
      const db = newDb(mechanism);
      try {
        await withClient(proxyClient({ query: { authMechanism: mechanism } }), async (c) => {
          const coll = c.db(db).collection('c');
          await coll.insertOne({ _id: mechanism });
          assert.deepStrictEqual(await coll.findOne({ _id: mechanism }), { _id: mechanism });
        });
      } finally {
        await dropDb(db);
      }
    });
  }

  test('default mechanism negotiation: SCRAM-SHA-256 with speculativeAuthenticate', async (t) => {
    // No authMechanism: the driver asks hello for saslSupportedMechs and puts the first SCRAM
    // message into the handshake (speculativeAuthenticate). Handshake commands are not
    // command-monitored (the pool attaches its listeners after the handshake), so this test
    // records them by wrapping the driver's internal Connection.prototype.command.
    const sent = [];
    const original = Connection.prototype.command;
    Connection.prototype.command = function (ns, cmd, ...rest) {
      sent.push(cmd);
      return original.call(this, ns, cmd, ...rest);
    };
    try {
      await withClient(proxyClient({ maxPoolSize: 1 }), async (c) => {
        assert.equal((await c.db('admin').command({ ping: 1 })).ok, 1);
      });
    } finally {
      Connection.prototype.command = original;
    }
    const names = sent.map((cmd) => Object.keys(cmd)[0]);
    t.diagnostic(`commands sent on connections: ${names.join(', ')}`);
    const handshake = sent.find((cmd) => cmd.speculativeAuthenticate);
    assert.ok(handshake, `no handshake carried speculativeAuthenticate: ${names}`);
    const hsName = Object.keys(handshake)[0];
    assert.ok(['hello', 'isMaster', 'ismaster'].includes(hsName), hsName);
    assert.equal(handshake.speculativeAuthenticate.mechanism, 'SCRAM-SHA-256');
    assert.equal(handshake.saslSupportedMechs, `admin.${USER}`);
    assert.ok(names.includes('saslContinue'), `speculative auth was not continued: ${names}`);
    assert.ok(!names.includes('saslStart'), `the driver fell back to saslStart: ${names}`);
    t.diagnostic(`handshake command: ${hsName} (helloOk: ${handshake.helloOk})`);
  });

  test('wrong password is AuthenticationFailed (18)', async () => {
    await withClient(proxyClient({ password: `${PASSWORD}-wrong` }), async (c) => {
      const err = await expectError(() => c.db('admin').command({ ping: 1 }));
      assert.ok(err instanceof MongoServerError, `${err.name}: ${err.message}`);
      assert.equal(err.code, AUTH_FAILED, `${err.code}: ${err.message}`);
    });
  });

  test('unknown user is AuthenticationFailed (18)', async () => {
    await withClient(proxyClient({ user: `nobody-${process.pid}`, password: 'x' }), async (c) => {
      const err = await expectError(() => c.db('admin').command({ ping: 1 }));
      assert.equal(err.code, AUTH_FAILED, `${err.name} ${err.code}: ${err.message}`);
    });
  });

  test('an unauthenticated command is Unauthorized (13), the connection stays usable', async () => {
    const db = newDb('unauth');
    const watch = new Watch();
    await withClient(watch.attach(proxyClient({ user: null, maxPoolSize: 1 })), async (c) => {
      const err = await expectError(() => c.db(db).collection('c').findOne({}));
      assert.equal(err.code, UNAUTHORIZED, `${err.name} ${err.code}: ${err.message}`);
      const hello = await c.db('admin').command({ hello: 1 });
      assert.equal(hello.msg, 'isdbgrid');
      assert.equal(watch.created, 1, `connections created ${watch.created}`);
      assert.equal(watch.closed, 0, `connections closed ${watch.closed}`);
      assert.equal(watch.poolClears, 0);
    });
  });

  test(`${CHURN_CLIENTS} short-lived clients, ${CHURN_CONCURRENCY} at a time, use at most pool_size upstream connections`, async (t) => {
    const db = newDb('churn');
    const uri = proxyUri();
    const before = await standinStats(STANDIN_ADDR);
    const failures = await runLimited(CHURN_CLIENTS, CHURN_CONCURRENCY, async (i) => {
      const c = new MongoClient(uri, { ...CLIENT_OPTS, maxPoolSize: 1 });
      try {
        const coll = c.db(db).collection('churn');
        await coll.insertOne({ _id: i, who: `client-${i}` });
        const back = await coll.findOne({ _id: i });
        assert.deepStrictEqual(back, { _id: i, who: `client-${i}` });
      } finally {
        await c.close();
      }
    });
    const after = await standinStats(STANDIN_ADDR);
    const { conns, auths } = upstreamDelta(before, after);
    const inserts = Number(after.commands.insert ?? 0) - Number(before.commands.insert ?? 0);
    const finds = Number(after.commands.find ?? 0) - Number(before.commands.find ?? 0);
    // MongoClient.close() sends endSessions with noResponse: it does not wait for the reply and
    // closes the socket at once, so the request is usually still in flight in mongoguard.
    const endSessions = Number(after.commands.endsessions ?? 0) - Number(before.commands.endsessions ?? 0);
    const line =
      `churn: ${CHURN_CLIENTS} clients (${CHURN_CONCURRENCY} at a time), ${failures.length} errors; ` +
      `upstream connections accepted ${conns}, authentications ${auths}, inserts ${inserts}, finds ${finds}, ` +
      `endSessions ${endSessions} ` +
      `(pool_size ${POOL_SIZE})`;
    t.diagnostic(line);
    console.log(`# ${line}`);
    assert.deepEqual(failures.slice(0, 5), [], `${failures.length} clients failed`);
    assert.ok(conns <= POOL_SIZE, `${conns} upstream connections > pool_size ${POOL_SIZE}`);
    assert.ok(auths <= POOL_SIZE, `${auths} upstream authentications > pool_size ${POOL_SIZE}`);
    assert.equal(inserts, CHURN_CLIENTS);
    assert.equal(finds, CHURN_CLIENTS);
    await withClient(proxyClient(), async (c) => {
      assert.equal(await c.db(db).collection('churn').countDocuments({}), CHURN_CLIENTS);
    });
    await dropDb(db);
  });

  test('a cursor crosses getMore batches', async () => {
    const db = newDb('cursor');
    const watch = new Watch();
    await withClient(watch.attach(proxyClient({ monitorCommands: true })), async (c) => {
      const coll = c.db(db).collection('docs');
      await coll.insertMany(Array.from({ length: 1000 }, (_, i) => ({ _id: i, v: i * 2 })));
      const seen = new Map();
      for await (const d of coll.find({}).batchSize(100)) seen.set(d._id, d.v);
      assert.equal(seen.size, 1000);
      for (let i = 0; i < 1000; i++) assert.equal(seen.get(i), i * 2);
      assert.ok(watch.count('getMore') >= 9, `getMores: ${watch.count('getMore')}`);
    });
    await dropDb(db);
  });

  test('a transaction with session.withTransaction completes', async () => {
    const db = newDb('txn');
    const watch = new Watch();
    await withClient(watch.attach(proxyClient({ monitorCommands: true })), async (c) => {
      const coll = c.db(db).collection('txn');
      await coll.insertOne({ _id: 'before' }); // the collection exists before the transaction
      const session = c.startSession();
      try {
        await session.withTransaction(async () => {
          await coll.insertOne({ _id: 'a' }, { session });
          await coll.insertOne({ _id: 'b' }, { session });
          assert.ok(await coll.findOne({ _id: 'a' }, { session }));
        });
      } finally {
        await session.endSession();
      }
      const first = watch.started.find((e) => e.name === 'insert' && e.command.startTransaction);
      assert.ok(first, 'no insert carried startTransaction');
      assert.equal(first.command.autocommit, false);
      assert.equal(watch.count('commitTransaction'), 1, watch.names().join(','));
      const ids = new Set((await coll.find({}).toArray()).map((d) => d._id));
      for (const id of ['before', 'a', 'b']) assert.ok(ids.has(id), [...ids].join(','));

      // An aborted transaction also completes (the stand-in has no transaction semantics, so
      // only completion is checked).
      const s2 = c.startSession();
      try {
        s2.startTransaction();
        await coll.insertOne({ _id: 'c' }, { session: s2 });
        await s2.abortTransaction();
      } finally {
        await s2.endSession();
      }
      assert.equal(watch.count('abortTransaction'), 1);
      assert.ok(await coll.findOne({ _id: 'before' }));
    });
    await dropDb(db);
  });

  test('a blocked command in pooled mode is 65001, attempted once, and the client still works', async () => {
    const db = newDb('guard');
    const watch = new Watch();
    await withClient(watch.attach(proxyClient({ monitorCommands: true })), async (c) => {
      const coll = c.db(db).collection('g');
      await coll.insertMany([0, 1, 2].map((i) => ({ _id: i })));
      const err = await expectError(() => coll.deleteMany({}));
      assertBlocked(err, 'W003');
      assert.equal(err.code, BLOCK_CODE);
      assert.equal(watch.count('delete'), 1, 'the driver retried the blocked delete');
      assert.equal(await coll.countDocuments({}), 3);
      await coll.insertOne({ _id: 3 });
      assert.equal(await coll.countDocuments({}), 4);
      assert.equal(watch.poolClears, 0);
    });
    await dropDb(db);
  });
});
