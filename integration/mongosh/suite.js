// mongosh (the MongoDB shell, pinned in package.json) through mongoguard, run by
// integration/run_sdks.sh: `mongosh URI --file suite.js`, with MG_MODE, MG_STANDIN_URI (a
// direct connection to the stand-in, for its counters) and MG_COMPRESSION ("1" when the mode
// negotiates compression) in the environment.
const mode = process.env.MG_MODE;
function fail(msg) {
  print(`mongosh/${mode}: FAIL: ${msg}`);
  quit(1);
}
function ok(msg) {
  print(`mongosh/${mode}: ok: ${msg}`);
}
const standin = new Mongo(process.env.MG_STANDIN_URI).getDB('admin');
const stats = () => standin.runCommand({ standinStats: 1 });
const before = stats();

const d = db.getSiblingDB('sdk_sh');
const run = `${mode}-${Date.now()}`;
const docs = [];
for (let i = 0; i < 250; i++) docs.push({ run, i, pad: 'x'.repeat(100) });
if (d.t_sh.insertMany(docs).insertedIds === undefined) fail('insertMany');
// A cursor past its first batch, with its getMores explicit, in one explicit session:
// mongod refuses a getMore sent in another session than its find's (the stand-in too), and
// runCommand's implicit sessions need not be the same from one call to the next (a CI run
// saw its getMore in another session than the find).
const cursorSession = db.getMongo().startSession();
const cd = cursorSession.getDatabase('sdk_sh');
let reply = cd.runCommand({ find: 't_sh', filter: { run }, batchSize: 50 });
let seen = reply.cursor.firstBatch.length;
let getMores = 0;
while (reply.cursor.id.toString() !== '0') {
  reply = cd.runCommand({ getMore: reply.cursor.id, collection: 't_sh', batchSize: 50 });
  seen += reply.cursor.nextBatch.length;
  getMores++;
}
cursorSession.endSession();
if (seen !== 250 || getMores < 4) fail(`cursor: ${seen} documents, ${getMores} getMore`);
ok(`250 documents through a cursor of batch 50 (${getMores} getMore)`);
if (d.t_sh.updateOne({ run, i: 0 }, { $set: { x: 1 } }).modifiedCount !== 1) fail('updateOne');
if (d.t_sh.findOne({ run, i: 0 }).x !== 1) fail('findOne after update');
if (d.t_sh.deleteOne({ run, i: 1 }).deletedCount !== 1) fail('deleteOne');
if (d.t_sh.countDocuments({ run }) !== 249) fail('countDocuments');
ok('CRUD');

const updatesBefore = Number(stats().commands.update || 0);
try {
  d.t_sh.updateMany({}, { $set: { y: 1 } });
  fail('updateMany({}) was not refused');
} catch (e) {
  if (e.code !== 65001 || !e.message.includes('W001') || !e.message.includes('Instead: ')) {
    fail(`blocked error: ${e.code} ${e.message}`);
  }
  ok(`blocked: ${e.message}`);
}
if (Number(stats().commands.update || 0) !== updatesBefore) fail('the blocked update reached the upstream');
if (d.t_sh.countDocuments({ y: 1 }) !== 0) fail('the blocked update changed documents');
d.t_sh.deleteMany({ run });
const compressed = Number(stats().compressedMessages) - Number(before.compressedMessages);
if (process.env.MG_COMPRESSION === '1') {
  if (compressed < 5) fail(`compression: the stand-in saw ${compressed} compressed messages`);
  ok(`compression: ${compressed} compressed messages reached the upstream`);
} else {
  ok(`compression: the upstream gets requests decompressed in this mode (${compressed} compressed); the harness counts them on mongoguard`);
}
