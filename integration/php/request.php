<?php
// One PHP-FPM request: a NEW MongoDB\Driver\Manager, one insert, one find by the inserted id,
// then one JSON line on stdout. Driven by integration/php/fpm.sh (fpm_load) through FastCGI.
//
// FastCGI parameters (cgi-fcgi sends its environment as parameters; they land in $_SERVER):
//   MONGO_URI    connection string (required)
//   REQUEST_ID   unique id of this request (required; the document's _id)
//   MONGO_RUN    stored in the document's `run` field (to count one run's documents)
//   MONGO_DB     database (default phpfpm)
//   MONGO_COLL   collection (default hits)
//
// Note: ext-mongodb keeps the underlying libmongoc client (and its socket) per worker process
// across requests, keyed by URI and options, even though the Manager object is new. So one
// FPM worker holds one connection per distinct URI for its whole life.

header('Content-Type: application/json');

function out(array $r): void
{
    echo json_encode($r, JSON_UNESCAPED_SLASHES), "\n";
}

$uri = $_SERVER['MONGO_URI'] ?? getenv('MONGO_URI');
$rid = $_SERVER['REQUEST_ID'] ?? getenv('REQUEST_ID');
$db = $_SERVER['MONGO_DB'] ?? 'phpfpm';
$coll = $_SERVER['MONGO_COLL'] ?? 'hits';
$run = $_SERVER['MONGO_RUN'] ?? '';
if (!$uri || !$rid) {
    out(['ok' => false, 'error' => 'MONGO_URI and REQUEST_ID are required', 'pid' => getmypid()]);
    exit;
}

try {
    $manager = new MongoDB\Driver\Manager($uri, ['serverSelectionTimeoutMS' => 30000]);

    $bulk = new MongoDB\Driver\BulkWrite();
    $bulk->insert(['_id' => (string) $rid, 'run' => (string) $run, 'pid' => getmypid(), 't' => microtime(true)]);
    $res = $manager->executeBulkWrite("$db.$coll", $bulk);
    if ($res->getInsertedCount() !== 1) {
        throw new RuntimeException('insertedCount ' . $res->getInsertedCount());
    }

    // The find's reply is this request's own: its one document has this request's _id, run and
    // worker pid. A reply delivered to the wrong client (another request's find) fails here.
    $cursor = $manager->executeQuery("$db.$coll", new MongoDB\Driver\Query(['_id' => (string) $rid]));
    $docs = $cursor->toArray();
    if (count($docs) !== 1) {
        throw new RuntimeException('find returned ' . count($docs) . ' documents');
    }
    $doc = $docs[0];
    if (($doc->_id ?? null) !== (string) $rid || ($doc->run ?? null) !== (string) $run
        || ($doc->pid ?? null) !== getmypid()) {
        throw new RuntimeException('reply mismatch: find by _id ' . $rid . ' returned '
            . json_encode($doc, JSON_UNESCAPED_SLASHES));
    }
    out(['ok' => true, 'id' => (string) $rid, 'pid' => getmypid()]);
} catch (Throwable $e) {
    out([
        'ok' => false,
        'id' => (string) $rid,
        'pid' => getmypid(),
        'class' => get_class($e),
        'code' => $e->getCode(),
        'error' => $e->getMessage(),
    ]);
}
