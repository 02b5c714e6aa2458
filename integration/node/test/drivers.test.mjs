// The official MongoDB Node.js driver through mongoguard (passthrough mode): the scenarios of
// integration/python/test_drivers.py.
//
// Environment (set by integration/run_node.sh):
//   MONGOGUARD_PROXY_URI   mongodb:// URI of the mongoguard proxy under test
//   MONGOGUARD_DIRECT_URI  mongodb:// URI of the upstream it fronts (the stand-in or a mongod),
//                          used to verify what really reached it
// Without them the suite skips itself, unless CI=true (then it fails).
//
// Every test works in its own database, dropped afterwards through the direct URI. Nothing
// asserts on wall-clock durations.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { MongoClient } from 'mongodb';
import { Watch, directClient, poll, runLimited, suiteEnv, uniqueDb, upstreamIsStandin } from '../lib/common.mjs';

const N = 1000;
const BATCH = 100;

const { env, skip, failure } = suiteEnv(
  'passthrough driver suite',
  ['MONGOGUARD_PROXY_URI', 'MONGOGUARD_DIRECT_URI'],
  'integration/run_node.sh',
);
const PROXY_URI = env.MONGOGUARD_PROXY_URI;
const DIRECT_URI = env.MONGOGUARD_DIRECT_URI;

const PROXY_OPTS = {
  directConnection: true,
  serverSelectionTimeoutMS: 30000,
  connectTimeoutMS: 20000,
};

function proxyClient(opts = {}) {
  return new MongoClient(PROXY_URI, { ...PROXY_OPTS, ...opts });
}

function originalDoc(i) {
  return {
    _id: i,
    n: i,
    group: i % 10,
    tag: `doc-${String(i).padStart(4, '0')}`,
    nested: { sq: i * i, list: [i, i + 1, i + 2] },
  };
}

function expectedAfterCrud() {
  const out = [];
  for (let i = 0; i < N; i++) {
    if (i % 10 === 7) continue;
    const d = originalDoc(i);
    if (i === 5) d.updated = true;
    if (i % 10 === 3) d.flag = 'g3';
    out.push(d);
  }
  return out;
}

/** Compressor names agreed by the client's idle pooled connections. Driver internals (where
 * the driver pinned by package-lock.json keeps them): when they move, this fails and must be
 * updated; it never returns "unknown". */
function negotiatedCompressors(client) {
  const names = new Set();
  const servers = client.topology?.s?.servers;
  assert.ok(servers instanceof Map, 'driver internals moved: client.topology.s.servers is gone');
  for (const server of servers.values()) {
    const conns = server.pool?.connections;
    assert.ok(conns && typeof conns[Symbol.iterator] === 'function', 'driver internals moved: server.pool.connections is gone');
    for (const conn of conns) {
      assert.ok(conn.description, 'driver internals moved: connection.description is gone');
      names.add(conn.description.compressor ?? 'none');
    }
  }
  assert.ok(names.size > 0, 'no idle pooled connection to inspect');
  return names;
}

/** Records the replies of successful heartbeats: the first is the monitoring connection's
 * handshake reply (the driver's public SDAM monitoring events). */
function watchHeartbeats(client) {
  const replies = [];
  client.on('serverHeartbeatSucceeded', (e) => replies.push(e.reply));
  return replies;
}

async function crudScenario(client, watch, direct, dbName) {
  const coll = client.db(dbName).collection('docs');

  const res = await coll.insertMany(Array.from({ length: N }, (_, i) => originalDoc(i)));
  assert.equal(res.insertedCount, N);

  let getMores = watch.count('getMore');
  const found = await coll.find({}).sort({ _id: 1 }).batchSize(BATCH).toArray();
  assert.equal(found.length, N);
  assert.deepStrictEqual(found, Array.from({ length: N }, (_, i) => originalDoc(i)));
  getMores = watch.count('getMore') - getMores;
  assert.ok(getMores >= N / BATCH - 1, `expected >= 9 getMore batches, saw ${getMores}`);

  let r = await coll.updateOne({ _id: 5 }, { $set: { updated: true } });
  assert.deepEqual([r.matchedCount, r.modifiedCount], [1, 1]);
  r = await coll.updateOne({ _id: -1 }, { $set: { updated: true } });
  assert.deepEqual([r.matchedCount, r.modifiedCount, r.upsertedId], [0, 0, null]);
  r = await coll.updateMany({ group: 3 }, { $set: { flag: 'g3' } });
  assert.deepEqual([r.matchedCount, r.modifiedCount], [100, 100]);
  r = await coll.updateMany({ group: 3 }, { $set: { flag: 'g3' } });
  assert.deepEqual([r.matchedCount, r.modifiedCount], [100, 0], 'a no-op update modifies nothing');

  assert.equal((await coll.deleteOne({ _id: 7 })).deletedCount, 1);
  // W004 (delete-many with a real filter) only warns: forwarded.
  assert.equal((await coll.deleteMany({ group: 7 })).deletedCount, 99);
  assert.equal((await coll.deleteOne({ _id: 7 })).deletedCount, 0);
  assert.equal(await coll.countDocuments({}), 900); // aggregate with $group
  assert.equal(await coll.estimatedDocumentCount(), 900); // the count command
  assert.ok(watch.count('count') >= 1, 'estimatedDocumentCount did not send count');
  assert.equal(await coll.countDocuments({ group: 3 }), 100);

  const agg = await coll
    .aggregate([
      { $match: { group: { $in: [1, 2] } } },
      { $sort: { n: -1 } },
      { $limit: 5 },
      { $project: { _id: 0, n: 1, group: 1 } },
    ])
    .toArray();
  assert.deepStrictEqual(
    agg,
    [992, 991, 982, 981, 972].map((n) => ({ n, group: n % 10 })),
  );

  const stored = await direct.db(dbName).collection('docs').find({}).sort({ _id: 1 }).toArray();
  assert.equal(stored.length, 900);
  assert.deepStrictEqual(stored, expectedAfterCrud());
}

describe('passthrough: Node driver through mongoguard', () => {
  if (failure) {
    test('environment', () => assert.fail(failure));
    return;
  }
  if (skip) {
    test('environment', { skip }, () => {});
    return;
  }

  let direct;
  const dbs = [];
  const newDb = (tag) => {
    const name = uniqueDb('mgt_node', tag);
    dbs.push(name);
    return name;
  };

  before(async () => {
    direct = directClient(DIRECT_URI);
    await direct.connect();
  });

  after(async () => {
    if (!direct) return;
    for (const name of dbs) await direct.db(name).dropDatabase().catch(() => {});
    await direct.close();
  });

  test('hello through the proxy', async () => {
    const client = proxyClient({ appName: 'mongoguard-node-hello' });
    try {
      const admin = client.db('admin');
      const hello = await admin.command({ hello: 1 });
      assert.equal(hello.ok, 1);
      assert.ok(hello.maxWireVersion >= 6, `maxWireVersion ${hello.maxWireVersion}`);
      for (const field of ['maxBsonObjectSize', 'maxMessageSizeBytes', 'maxWriteBatchSize']) {
        assert.ok((hello[field] ?? 0) > 0, `${field} missing: ${JSON.stringify(hello)}`);
      }
      assert.equal((await admin.command({ ping: 1 })).ok, 1);
      for (const legacy of ['isMaster', 'ismaster']) {
        assert.equal((await admin.command({ [legacy]: 1 })).ok, 1);
      }
    } finally {
      await client.close();
    }
  });

  test('hello without directConnection stays on the proxy', async (t) => {
    // Default discovery: the driver must only ever see the proxy.
    const client = new MongoClient(PROXY_URI, { serverSelectionTimeoutMS: 30000 });
    try {
      const hello = await client.db('admin').command({ hello: 1 });
      for (const field of ['hosts', 'setName', 'primary', 'me', 'passives', 'arbiters']) {
        assert.ok(!(field in hello), `hello through the proxy carries ${field}: ${JSON.stringify(hello)}`);
      }
      const url = new URL(PROXY_URI);
      const expected = `${url.hostname}:${url.port || 27017}`;
      const known = [...client.topology.description.servers.keys()];
      assert.deepEqual(known, [expected], `driver discovered ${known}`);
      const type = client.topology.description.type;
      assert.ok(['Single', 'Sharded'].includes(type), `topology type ${type}`);
      t.diagnostic(`topology type without directConnection: ${type}`);
    } finally {
      await client.close();
    }
  });

  test('streaming (awaitable, exhaust) hello monitoring works through the proxy', async (t) => {
    // The Node driver monitors a server whose hello carries topologyVersion with the streaming
    // protocol: an awaitable hello with exhaustAllowed, answered by moreToCome replies every
    // maxAwaitTimeMS (= heartbeatFrequencyMS). An upstream without topologyVersion (an old
    // mongod) makes it poll instead; then this test only records that.
    const heartbeats = [];
    const standin = await upstreamIsStandin(direct);
    const client = proxyClient({ heartbeatFrequencyMS: 500 });
    client.on('serverHeartbeatSucceeded', (e) => heartbeats.push({ awaited: e.awaited, reply: e.reply }));
    client.on('serverHeartbeatFailed', (e) => heartbeats.push({ failed: e.failure?.message }));
    try {
      const hello = await client.db('admin').command({ hello: 1 });
      const streaming = hello.topologyVersion !== undefined;
      // The stand-in always sends topologyVersion: through the proxy it must arrive.
      if (standin) assert.ok(streaming, `no topologyVersion through the proxy: ${JSON.stringify(hello)}`);
      const enough = () => heartbeats.filter((h) => h.awaited).length >= 3 || (!streaming && heartbeats.length >= 3);
      assert.ok(await poll(enough, 200, 100), `heartbeats: ${JSON.stringify(heartbeats.map((h) => h.awaited ?? h))}`);
      assert.deepEqual(heartbeats.filter((h) => h.failed), [], 'a heartbeat failed');
      t.diagnostic(`topologyVersion in hello: ${streaming}; heartbeats awaited: ${heartbeats.map((h) => h.awaited).join(',')}`);
      for (const h of heartbeats) {
        for (const field of ['hosts', 'setName']) {
          assert.ok(!(field in h.reply), `a monitoring hello through the proxy carries ${field}`);
        }
      }
      assert.equal((await client.db('admin').command({ ping: 1 })).ok, 1);
      if (!streaming) {
        // The checks above ran; the streaming protocol itself could not be exercised.
        t.skip('the upstream (an old mongod) sends no topologyVersion: streaming hello not exercised, polling checked');
      }
    } finally {
      await client.close();
    }
  });

  test('CRUD, a 1,000-document cursor across getMore batches, count, aggregate', async () => {
    const dbName = newDb('crud');
    const watch = new Watch();
    const client = watch.attach(proxyClient({ monitorCommands: true }));
    try {
      await crudScenario(client, watch, direct, dbName);
      assert.equal(watch.poolClears, 0);
    } finally {
      await client.close();
    }
  });

  test('CRUD with zlib compression', async () => {
    // Fails when zlib was not negotiated: the scenario alone would pass uncompressed.
    const dbName = newDb('crud_zlib');
    const watch = new Watch();
    const client = watch.attach(proxyClient({ monitorCommands: true, compressors: ['zlib'] }));
    const heartbeats = watchHeartbeats(client);
    try {
      await crudScenario(client, watch, direct, dbName);
      // The handshake reply that came through the proxy accepted zlib...
      assert.ok(heartbeats.length > 0, 'no successful heartbeat: no handshake reply to check');
      const handshake = heartbeats[0];
      assert.deepEqual(
        handshake.compression,
        ['zlib'],
        `the handshake reply through the proxy did not negotiate zlib: ${JSON.stringify(handshake)}`,
      );
      // ...and the connections that carried the scenario agreed on it.
      const agreed = negotiatedCompressors(client);
      assert.deepEqual([...agreed], ['zlib'], `pooled connections through the proxy negotiated ${[...agreed]}`);
    } finally {
      await client.close();
    }
  });

  for (const compressor of ['snappy', 'zstd']) {
    test(`CRUD with ${compressor} compression`, {
      skip:
        `the Node driver needs the optional native package ` +
        `${compressor === 'snappy' ? 'snappy' : '@mongodb-js/zstd'} for ${compressor}; this suite ` +
        `depends on mongodb only (pymongo covers ${compressor} through the proxy)`,
    }, () => {});
  }

  test('bulkWrite (allowed)', async () => {
    const dbName = newDb('bulk');
    const watch = new Watch();
    const client = watch.attach(proxyClient({ monitorCommands: true }));
    try {
      const coll = client.db(dbName).collection('b');
      const r = await coll.bulkWrite([
        { insertOne: { document: { _id: 1, g: 'a' } } },
        { insertOne: { document: { _id: 2, g: 'a' } } },
        { insertOne: { document: { _id: 3, g: 'b' } } },
        { updateOne: { filter: { _id: 1 }, update: { $set: { x: 1 } } } },
        { updateMany: { filter: { g: 'a' }, update: { $set: { y: 1 } } } },
        { replaceOne: { filter: { _id: 3 }, replacement: { g: 'b', replaced: true } } },
        { deleteOne: { filter: { _id: 2 } } },
        { updateOne: { filter: { _id: 9 }, update: { $set: { g: 'c' } }, upsert: true } },
      ]);
      assert.equal(r.insertedCount, 3);
      assert.equal(r.matchedCount, 4);
      assert.equal(r.modifiedCount, 4);
      assert.equal(r.deletedCount, 1);
      assert.equal(r.upsertedCount, 1);
      const stored = await direct.db(dbName).collection('b').find({}).sort({ _id: 1 }).toArray();
      assert.deepStrictEqual(stored, [
        { _id: 1, g: 'a', x: 1, y: 1 },
        { _id: 3, g: 'b', replaced: true },
        { _id: 9, g: 'c' },
      ]);
      assert.equal(watch.poolClears, 0);
    } finally {
      await client.close();
    }
  });

  test('unacknowledged (w:0) writes, then a read sees them', async () => {
    const dbName = newDb('w0');
    const client = proxyClient();
    try {
      const coll = client.db(dbName).collection('w0');
      const w0 = client.db(dbName).collection('w0', { writeConcern: { w: 0 } });
      const r = await w0.insertOne({ _id: 'a', v: 1 });
      assert.equal(r.acknowledged, false);
      await w0.insertMany(Array.from({ length: 10 }, (_, i) => ({ _id: `m${i}`, v: i })));
      await w0.updateOne({ _id: 'a' }, { $set: { v: 2 } });
      await w0.deleteOne({ _id: 'm9' });
      assert.equal((await client.db('admin').command({ ping: 1 })).ok, 1);
      const expected = [{ _id: 'a', v: 2 }, ...Array.from({ length: 9 }, (_, i) => ({ _id: `m${i}`, v: i }))];
      const same = async () => {
        const docs = await coll.find({}).sort({ _id: 1 }).toArray();
        try {
          assert.deepStrictEqual(docs, expected);
          return true;
        } catch {
          return false;
        }
      };
      assert.ok(await poll(same), JSON.stringify(await coll.find({}).sort({ _id: 1 }).toArray()));
      assert.deepStrictEqual(await direct.db(dbName).collection('w0').find({}).sort({ _id: 1 }).toArray(), expected);
    } finally {
      await client.close();
    }
  });

  test('200 concurrent clients', async () => {
    const dbName = newDb('concurrent');
    const clients = 200;
    const failures = await runLimited(clients, clients, async (i) => {
      const client = proxyClient({ maxPoolSize: 2, serverSelectionTimeoutMS: 120000 });
      try {
        const coll = client.db(dbName).collection('c');
        const doc = { _id: i, client: `client-${i}` };
        await coll.insertOne({ ...doc });
        const back = await coll.findOne({ _id: i });
        assert.deepStrictEqual(back, doc);
      } finally {
        await client.close();
      }
    });
    assert.deepEqual(failures, [], `${failures.length} of ${clients} clients failed`);
    const stored = await direct.db(dbName).collection('c').find({}).sort({ _id: 1 }).toArray();
    assert.deepStrictEqual(stored, Array.from({ length: clients }, (_, i) => ({ _id: i, client: `client-${i}` })));
  });
});
