// Shared by the Node driver suites in ../test (not a test file itself: node --test only
// collects ../test). Plain node:assert, no test framework beyond node:test.

import assert from 'node:assert/strict';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { BSON, MongoClient } from 'mongodb';

export const BLOCK_CODE = 65001;
export const BLOCK_CODE_NAME = 'MongoguardPolicyViolation';
export const BLOCK_PREFIX = 'mongoguard blocked this command: ';
export const AUTH_FAILED = 18;
export const UNAUTHORIZED = 13;

const OP_MSG = 2013;

/**
 * The environment a suite needs. Returns `{ env, skip }`: `skip` is a reason string when a
 * variable is missing (the suite then skips itself), or false. Under CI=true a missing
 * variable is a failure, not a skip: `missing` lists them and `requireEnv` tests fail.
 */
export function suiteEnv(suite, names, runner) {
  const env = {};
  const missing = [];
  for (const name of names) {
    const value = process.env[name];
    if (value) env[name] = value;
    else missing.push(name);
  }
  if (missing.length === 0) return { env, skip: false, missing };
  const reason = `${suite}: ${missing.join(', ')} not set (run ${runner})`;
  if (process.env.CI === 'true') return { env, skip: false, missing, failure: reason };
  return { env, skip: reason, missing };
}

/** A database name unique to this test and run. */
export function uniqueDb(prefix, tag) {
  const clean = String(tag).replace(/[^A-Za-z0-9]/g, '_').slice(0, 24);
  return `${prefix}_${clean}_${process.pid}_${randomBytes(4).toString('hex')}`;
}

/** The client's `directConnection` for a direct (verification) URI, like the Python suite. */
export function directClient(uri, extra = {}) {
  const opts = { serverSelectionTimeoutMS: 30000, ...extra };
  if (!/directconnection=/i.test(uri)) opts.directConnection = true;
  return new MongoClient(uri, opts);
}

/**
 * Records what the driver did: started commands (name and body), connection-pool clears,
 * connections created/closed. `attach(client)` before connecting; the client must be created
 * with `monitorCommands: true` for command events.
 */
export class Watch {
  constructor() {
    this.started = [];
    this.failed = [];
    this.poolClears = 0;
    this.created = 0;
    this.closed = 0;
  }

  attach(client) {
    client.on('commandStarted', (e) => this.started.push({ name: e.commandName, command: e.command }));
    client.on('commandFailed', (e) => this.failed.push({ name: e.commandName, failure: e.failure }));
    client.on('connectionPoolCleared', () => {
      this.poolClears += 1;
    });
    client.on('connectionCreated', () => {
      this.created += 1;
    });
    client.on('connectionClosed', () => {
      this.closed += 1;
    });
    return client;
  }

  count(name) {
    return this.started.filter((e) => e.name === name).length;
  }

  last(name) {
    for (let i = this.started.length - 1; i >= 0; i--) {
      if (this.started[i].name === name) return this.started[i].command;
    }
    assert.fail(`the driver never started ${name}`);
  }

  names() {
    return this.started.map((e) => e.name);
  }
}

/** The block reply as the Node driver surfaces it (a MongoServerError). */
export function assertBlocked(err, rule) {
  assert.ok(err, 'expected an error');
  assert.equal(err.name, 'MongoServerError', `not a MongoServerError: ${err?.name}: ${err?.message}`);
  assert.equal(err.code, BLOCK_CODE, `code ${err.code}: ${err.message}`);
  assert.equal(err.codeName, BLOCK_CODE_NAME, `codeName ${err.codeName}`);
  const errmsg = err.errmsg ?? err.message;
  assert.ok(errmsg.startsWith(BLOCK_PREFIX), `errmsg: ${errmsg}`);
  assert.ok(errmsg.includes(rule), `${rule} not in ${JSON.stringify(errmsg)}`);
  assert.ok(err.message.includes(rule), `${rule} not in the message ${JSON.stringify(err.message)}`);
  assert.deepEqual(err.errorLabels, [], `a block must carry no errorLabels: ${err.errorLabels}`);
  if (err.errorResponse) {
    assert.ok(!('errorLabels' in err.errorResponse), `errorLabels in the reply: ${JSON.stringify(err.errorResponse)}`);
    assert.equal(err.errorResponse.ok, 0);
  }
  for (const label of ['RetryableWriteError', 'TransientTransactionError', 'NoWritesPerformed']) {
    assert.ok(!err.hasErrorLabel(label), `${label} on a block`);
  }
}

/** Runs `op`, expects a block by `rule`, and that `command` was started exactly once. */
export async function expectBlocked(watch, command, rule, op) {
  const before = watch.count(command);
  let caught;
  try {
    await op();
  } catch (err) {
    caught = err;
  }
  assert.ok(caught, `${rule}: the operation was not blocked`);
  assert.equal(watch.count(command) - before, 1, `${rule}: the driver started ${command} ${watch.count(command) - before} times`);
  assertBlocked(caught, rule);
  return caught;
}

/** True as soon as `check()` resolves truthy, within `attempts` tries `pauseMs` apart. */
export async function poll(check, attempts = 100, pauseMs = 100) {
  for (let i = 0; i < attempts; i++) {
    if (await check()) return true;
    if (i + 1 < attempts) await sleep(pauseMs);
  }
  return false;
}

/**
 * `{standinStats: 1}` on one fresh raw connection to the stand-in (no hello, no auth), as
 * integration/python/test_pooled.py does; the connection itself counts as one accepted
 * connection. Reply: {connectionsAccepted, connectionsOpen, authentications, messages,
 * commands: {name: n}, member, isWritablePrimary, ok}.
 */
export function standinStats(addr, reset = false) {
  const idx = addr.lastIndexOf(':');
  const host = addr.slice(0, idx);
  const port = Number(addr.slice(idx + 1));
  const cmd = { standinStats: 1, $db: 'admin' };
  if (reset) cmd.reset = true;
  const doc = BSON.serialize(cmd);
  const header = Buffer.alloc(16 + 5);
  header.writeInt32LE(16 + 5 + doc.length, 0);
  header.writeInt32LE(7, 4);
  header.writeInt32LE(0, 8);
  header.writeInt32LE(OP_MSG, 12);
  header.writeUInt32LE(0, 16); // flagBits
  header.writeUInt8(0, 20); // section kind 0
  const request = Buffer.concat([header, doc]);

  return new Promise((resolve, reject) => {
    const sock = net.createConnection({ host, port });
    const chunks = [];
    let got = 0;
    sock.setTimeout(30000, () => sock.destroy(new Error(`standinStats: no reply from ${addr}`)));
    sock.on('connect', () => sock.write(request));
    sock.on('data', (chunk) => {
      chunks.push(chunk);
      got += chunk.length;
      const buf = Buffer.concat(chunks, got);
      if (buf.length < 4) return;
      const length = buf.readInt32LE(0);
      if (buf.length < length) return;
      sock.end();
      try {
        const opcode = buf.readInt32LE(12);
        assert.equal(opcode, OP_MSG, `standinStats: reply opcode ${opcode}`);
        assert.equal(buf.readUInt8(20), 0, 'standinStats: first section is not a body');
        const reply = BSON.deserialize(buf.subarray(21, length), { promoteLongs: true });
        assert.equal(reply.ok, 1, `standinStats failed: ${JSON.stringify(reply)}`);
        resolve(reply);
      } catch (err) {
        reject(err);
      }
    });
    sock.on('error', reject);
  });
}

/** True when `direct` (a connected client) talks to mongoguard-standin, which answers its
 * own `standinStats` command; false against a real mongod (CommandNotFound). */
export async function upstreamIsStandin(direct) {
  try {
    const reply = await direct.db('admin').command({ standinStats: 1 });
    return reply.ok === 1;
  } catch (err) {
    if (err?.code === 59) return false; // CommandNotFound
    throw err;
  }
}

/** (connections accepted, authentications) between two standinStats() replies, not counting
 * the connection the second call opened. */
export function upstreamDelta(before, after) {
  return {
    conns: Number(after.connectionsAccepted) - Number(before.connectionsAccepted) - 1,
    auths: Number(after.authentications) - Number(before.authentications),
  };
}

/** Runs `fn(i)` for i in [0, n) with at most `limit` in flight; resolves to the failures. */
export async function runLimited(n, limit, fn) {
  const failures = [];
  let next = 0;
  async function worker() {
    while (next < n) {
      const i = next++;
      try {
        await fn(i);
      } catch (err) {
        failures.push(`#${i}: ${err?.name}: ${err?.message}`);
      }
    }
  }
  await Promise.all(Array.from({ length: Math.min(limit, n) }, worker));
  return failures;
}
