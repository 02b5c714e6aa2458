// Policy enforcement through the Node driver (passthrough mode, the built-in `standard`
// profile): the scenarios of integration/python/test_guard.py.
//
// A blocked command must surface as a MongoServerError with code 65001, codeName
// "MongoguardPolicyViolation", the rule id in errmsg and no error labels; the driver must start
// the command exactly once (command monitoring) and never clear its pool; the data must be
// unchanged upstream (checked through the direct URI); the same client must keep working.
//
// Environment: MONGOGUARD_PROXY_URI and MONGOGUARD_DIRECT_URI (see drivers.test.mjs).

import assert from 'node:assert/strict';
import { after, afterEach, before, beforeEach, describe, test } from 'node:test';
import { MongoBulkWriteError, MongoClient } from 'mongodb';
import { Watch, assertBlocked, directClient, expectBlocked, suiteEnv, uniqueDb } from '../lib/common.mjs';

const { env, skip, failure } = suiteEnv(
  'passthrough guard suite',
  ['MONGOGUARD_PROXY_URI', 'MONGOGUARD_DIRECT_URI'],
  'integration/run_node.sh',
);
const PROXY_URI = env.MONGOGUARD_PROXY_URI;
const DIRECT_URI = env.MONGOGUARD_DIRECT_URI;

const SEED = [
  { _id: 1, v: 1, g: 'a' },
  { _id: 2, v: 2, g: 'a' },
  { _id: 3, v: 3, g: 'b' },
];
const seed = () => SEED.map((d) => ({ ...d }));

describe('guard: blocked commands through the Node driver', () => {
  if (failure) {
    test('environment', () => assert.fail(failure));
    return;
  }
  if (skip) {
    test('environment', { skip }, () => {});
    return;
  }

  let direct;
  let client;
  let watch;
  let db; // a fresh database per test, seeded through the direct URI

  before(async () => {
    direct = directClient(DIRECT_URI);
    await direct.connect();
  });

  after(async () => {
    await direct?.close();
  });

  beforeEach(async (t) => {
    db = uniqueDb('mgt_nodeg', t.name);
    await direct.db(db).collection('c').insertMany(seed());
    watch = new Watch();
    client = watch.attach(
      new MongoClient(PROXY_URI, {
        directConnection: true,
        serverSelectionTimeoutMS: 30000,
        connectTimeoutMS: 20000,
        monitorCommands: true,
      }),
    );
    await client.db('admin').command({ ping: 1 });
  });

  afterEach(async () => {
    await client?.close();
    await direct.db(db).dropDatabase().catch(() => {});
  });

  const stored = () => direct.db(db).collection('c').find({}).sort({ _id: 1 }).toArray();

  async function assertUnchanged() {
    assert.deepStrictEqual(await stored(), SEED, 'the data changed upstream');
  }

  async function assertStillWorks() {
    assert.deepStrictEqual(await client.db(db).collection('c').findOne({ _id: 1 }), SEED[0]);
    assert.equal((await client.db('admin').command({ ping: 1 })).ok, 1);
    assert.equal(watch.poolClears, 0, 'the driver cleared its pool after a block');
  }

  test('deleteMany({}) is blocked (W003), attempted once', async () => {
    const coll = client.db(db).collection('c');
    const err = await expectBlocked(watch, 'delete', 'W003', () => coll.deleteMany({}));
    assert.ok(err.errmsg.includes('delete-many-without-filter'), err.errmsg);
    assert.equal(watch.failed.filter((f) => f.name === 'delete').length, 1);
    await assertUnchanged();
    await assertStillWorks();
  });

  test('updateMany({}, {$set}) is blocked (W001)', async () => {
    const coll = client.db(db).collection('c');
    const err = await expectBlocked(watch, 'update', 'W001', () => coll.updateMany({}, { $set: { x: 1 } }));
    assert.ok(err.errmsg.includes('multi-update-without-filter'), err.errmsg);
    await assertUnchanged();
    await assertStillWorks();
  });

  test('updateMany with a tautological filter is blocked (W001)', async () => {
    const coll = client.db(db).collection('c');
    await expectBlocked(watch, 'update', 'W001', () =>
      coll.updateMany({ _id: { $exists: true } }, { $set: { x: 1 } }),
    );
    await assertUnchanged();
    await assertStillWorks();
  });

  test('insert into the admin database is blocked (W005), a retryable write attempted once', async () => {
    const target = uniqueDb('mgt_nodeg_admin', 'c');
    try {
      await expectBlocked(watch, 'insert', 'W005', () =>
        client.db('admin').collection(target).insertOne({ _id: 1 }),
      );
      assert.equal(await direct.db('admin').collection(target).countDocuments({}), 0, 'the insert reached admin');
    } finally {
      if ((await direct.db('admin').collection(target).countDocuments({})) > 0) {
        await direct.db('admin').dropCollection(target);
      }
    }
    await assertStillWorks();
  });

  test('insert into system.js is blocked (W005)', async () => {
    await expectBlocked(watch, 'insert', 'W005', () =>
      client.db(db).collection('system.js').insertOne({ _id: 'f', value: 'x' }),
    );
    assert.equal(await direct.db(db).collection('system.js').countDocuments({}), 0);
    await assertStillWorks();
  });

  test('a write with writeConcern {w: 1, j: false} is blocked (W006)', async () => {
    const coll = client.db(db).collection('c', { writeConcern: { w: 1, journal: false } });
    await expectBlocked(watch, 'insert', 'W006', () => coll.insertOne({ _id: 10, v: 10, g: 'c' }));
    const sent = watch.last('insert');
    assert.deepEqual(sent.writeConcern, { w: 1, j: false }, `the driver sent ${JSON.stringify(sent.writeConcern)}`);
    await assertUnchanged();
    await assertStillWorks();
  });

  test('bulkWrite with an updateMany({}) statement is blocked whole (W001)', async () => {
    const coll = client.db(db).collection('c');
    const before = watch.count('update');
    let caught;
    try {
      await coll.bulkWrite([
        { updateOne: { filter: { _id: 1 }, update: { $set: { y: 1 } } } },
        { updateMany: { filter: {}, update: { $set: { x: 1 } } } },
      ]);
    } catch (err) {
      caught = err;
    }
    assert.ok(caught, 'the bulkWrite was not blocked');
    assert.equal(watch.count('update') - before, 1, 'the driver retried the bulk update');
    // The Node driver wraps a command-level error of a bulk batch in a MongoBulkWriteError
    // (pymongo raises the OperationFailure itself). The wrapped reply is the block.
    assert.ok(caught instanceof MongoBulkWriteError, `${caught.name}: ${caught.message}`);
    assert.equal(caught.code, 65001, `code ${caught.code}`);
    assert.ok(caught.message.includes('W001') && caught.message.includes('(statement 1)'), caught.message);
    assert.deepEqual(caught.errorLabels, []);
    assert.deepEqual(caught.writeErrors, [], 'a command-level block has no per-statement writeErrors');
    const failed = watch.failed.find((f) => f.name === 'update');
    assertBlocked(failed.failure, 'W001');
    await assertUnchanged(); // the harmless first statement was not applied either
    await assertStillWorks();
  });

  test('blocks never retry nor clear the pool', async () => {
    const coll = client.db(db).collection('c');
    for (let i = 0; i < 5; i++) {
      await expectBlocked(watch, 'update', 'W001', () => coll.updateMany({}, { $set: { x: 1 } }));
      await expectBlocked(watch, 'delete', 'W003', () => coll.deleteMany({}));
    }
    assert.equal(watch.count('update'), 5);
    assert.equal(watch.count('delete'), 5);
    await assertUnchanged();
    await assertStillWorks();
  });

  test('deleteMany with a real filter only warns (W004): forwarded', async () => {
    const r = await client.db(db).collection('c').deleteMany({ g: 'b' });
    assert.equal(r.deletedCount, 1);
    assert.equal(watch.count('delete'), 1);
    assert.deepStrictEqual(await stored(), SEED.slice(0, 2), 'the delete did not happen upstream');
    await assertStillWorks();
  });

  test('updateOne({}) only warns (W002): forwarded', async () => {
    const r = await client.db(db).collection('c').updateOne({}, { $set: { x: 1 } });
    assert.equal(r.matchedCount, 1);
    assert.equal((await stored()).filter((d) => d.x === 1).length, 1);
  });

  test('conditioned writes pass', async () => {
    const coll = client.db(db).collection('c');
    const r = await coll.updateMany({ g: 'a' }, { $set: { x: 1 } });
    assert.deepEqual([r.matchedCount, r.modifiedCount], [2, 2]);
    await coll.insertOne({ _id: 4, v: 4, g: 'b' });
    const docs = await stored();
    assert.equal(docs.length, 4);
    assert.deepEqual(docs.filter((d) => d.x === 1).map((d) => d._id), [1, 2]);
  });
});
