// Serverless-style load with the official Node.js driver: every operation constructs a new
// MongoClient(uri), runs one command (ping on the admin database) and closes the client.
//
//   node serverless.mjs --uri URI --concurrency N --duration S --warmup S [--label NAME]
//
// Closed loop: N concurrent async loops in this one process (one event loop, one driver
// module: the driver's SCRAM key cache, lib/cmap/auth/scram.js _hiCache, is module-wide, so
// only the first conversation runs PBKDF2). Operations that *complete* in the measured window
// (after the warmup, for --duration seconds) count for ops/s and the percentiles; every
// operation started is finished before exit and "ops_all" counts them all (warmup included).
// Nothing is tuned: new MongoClient(uri) with the URI's options only (the v6 driver connects
// on the first operation). Prints one JSON object on stdout.
import { MongoClient } from 'mongodb';
import { createRequire } from 'node:module';
import { parseArgs } from 'node:util';

const { values: a } = parseArgs({
  options: {
    uri: { type: 'string' },
    concurrency: { type: 'string', default: '1' },
    duration: { type: 'string', default: '10' },
    warmup: { type: 'string', default: '2' },
    command: { type: 'string', default: 'ping' },
    label: { type: 'string', default: '' },
  },
});
const conc = Number(a.concurrency);
const duration = Number(a.duration) * 1000;
const warmup = Number(a.warmup) * 1000;

const startAt = performance.now() + 200;
const warmEnd = startAt + warmup;
const end = warmEnd + duration;
const lat = [];
let opsAll = 0;
let errors = 0;
let firstError = null;

async function loop() {
  while (performance.now() < startAt) await new Promise((r) => setTimeout(r, 1));
  for (;;) {
    const t0 = performance.now();
    if (t0 >= end) break;
    let ok = true;
    try {
      const client = new MongoClient(a.uri);
      try {
        await client.db('admin').command({ [a.command]: 1 });
      } finally {
        await client.close();
      }
    } catch (e) {
      ok = false;
      errors += 1;
      if (firstError === null) firstError = `${e.name}: ${e.message}`.slice(0, 300);
    }
    const t1 = performance.now();
    opsAll += 1;
    if (ok && t1 >= warmEnd && t1 <= end) lat.push(t1 - t0);
  }
}

await Promise.all(Array.from({ length: conc }, loop));
const cpu = process.cpuUsage(); // this process, startup and warmup included
lat.sort((x, y) => x - y);
const pct = (q) =>
  lat.length ? lat[Math.min(lat.length - 1, Math.max(0, Math.round(q * lat.length + 0.5) - 1))] : null;
const us = (v) => (v === null ? null : Math.round(v * 1000));
const require = createRequire(import.meta.url);
console.log(
  JSON.stringify({
    driver: 'node',
    driver_version: require('mongodb/package.json').version,
    node: process.versions.node,
    label: a.label,
    mode: 'async loops in one process',
    concurrency: conc,
    duration_s: duration / 1000,
    warmup_s: warmup / 1000,
    ops_total: lat.length,
    ops_per_sec: lat.length / (duration / 1000),
    ops_all: opsAll,
    p50_us: us(pct(0.5)),
    p99_us: us(pct(0.99)),
    mean_us: lat.length ? us(lat.reduce((s, v) => s + v, 0) / lat.length) : null,
    client_cpu_s: (cpu.user + cpu.system) / 1e6,
    errors,
    first_error: firstError,
  }),
);
