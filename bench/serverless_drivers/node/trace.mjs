// Where the time of one serverless operation goes with the Node.js driver: runs
// new MongoClient(uri) + ping + close three times in this process and prints, for the third,
// the driver's monitoring events with milliseconds since the client was constructed
// (heartbeats, connection created/ready, checkouts, commands). A diagnostic, not a benchmark
// (monitorCommands and listeners are on here; serverless.mjs does not use them).
//
//   node trace.mjs 'mongodb://app:apppw@127.0.0.1:PORT/?authSource=admin&...'
//
// Against a delayrelay with --delay-ms D and again with --delay-ms 0, the difference of a
// step's duration divided by 2*D is the number of delayed round trips in that step.
import { MongoClient } from 'mongodb';

const uri = process.argv[2];
const names = [
  'serverHeartbeatStarted', 'serverHeartbeatSucceeded', 'serverDescriptionChanged',
  'connectionPoolReady', 'connectionCreated', 'connectionReady', 'connectionCheckOutStarted',
  'connectionCheckedOut', 'commandStarted', 'commandSucceeded',
];
for (let i = 0; i < 3; i++) {
  const t0 = performance.now();
  const ev = [];
  const client = new MongoClient(uri, { monitorCommands: true });
  const at = (name) => (e) =>
    ev.push(
      `${(performance.now() - t0).toFixed(1)} ${name}` +
        (e?.commandName ? ` ${e.commandName}` : '') +
        (e?.awaited !== undefined ? ` awaited=${e.awaited}` : '') +
        (e?.connectionId !== undefined ? ` conn=${e.connectionId}` : ''),
    );
  for (const n of names) client.on(n, at(n));
  await client.db('admin').command({ ping: 1 });
  ev.push(`${(performance.now() - t0).toFixed(1)} ping done`);
  await client.close();
  ev.push(`${(performance.now() - t0).toFixed(1)} closed`);
  if (i === 2) console.log(ev.join('\n'));
}
