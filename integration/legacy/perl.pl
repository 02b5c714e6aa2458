#!/usr/bin/perl
# The MongoDB Perl driver (Debian's libmongodb-perl 2.2.2): a legacy-era client. Against a
# server of wire version 13 (MongoDB 5.0) it sends every command in OP_QUERY and every
# unacknowledged (w=0) write as OP_INSERT / OP_UPDATE / OP_DELETE — the old opcodes legacy
# applications still produce. Run by integration/run_sdks.sh through mongoguard: MG_URI (the
# connection string, credentials included in pooled mode), MG_MODE.
use strict;
use warnings;
use MongoDB;
use Try::Tiny;

my $mode = $ENV{MG_MODE} // "?";
sub ok { print "perl/$mode: ok: @_\n" }
sub fail { print STDERR "perl/$mode: FAIL: @_\n"; exit 1 }

my $client = try { MongoDB->connect($ENV{MG_URI}, { server_selection_timeout_ms => 10000 }) }
    catch { fail("connect: $_") };
my $db = $client->get_database("sdk_perl");
my $build = try { $db->run_command([buildInfo => 1]) } catch { fail("buildInfo: $_") };
ok("connected and authenticated; server $build->{version}");

my $run = "$mode-" . time() . "-$$";
my $coll = $db->get_collection("t_perl");
$coll->insert_many([map { { run => $run, i => $_, pad => "x" x 100 } } 0 .. 249]);
my $seen = 0;
my $cursor = $coll->find({ run => $run }, { batchSize => 50 })->result;
while (my $d = $cursor->next) { $seen++ }
fail("cursor: $seen documents") unless $seen == 250;
ok("250 documents through a cursor of batch 50");

# Acknowledged CRUD (write commands in OP_QUERY).
my $u = $coll->update_one({ run => $run, i => 0 }, { '$set' => { x => 1 } });
fail("update_one matched " . $u->matched_count) unless $u->matched_count == 1;
my $d = $coll->delete_one({ run => $run, i => 1 });
fail("delete_one deleted " . $d->deleted_count) unless $d->deleted_count == 1;
ok("CRUD");

# Fire-and-forget writes: OP_INSERT, OP_UPDATE, OP_DELETE (no reply; checked by reading back).
my $w0 = $db->get_collection("t_perl", { write_concern => { w => 0 } });
$w0->insert_one({ run => $run, i => 1000, legacy => 1 });
$w0->update_one({ run => $run, i => 1000 }, { '$set' => { touched => 1 } });
$w0->delete_one({ run => $run, i => 2 });
my $settled = 0;
for (1 .. 100) {
    my $inserted = $coll->count_documents({ run => $run, i => 1000, touched => 1 });
    my $gone = $coll->count_documents({ run => $run, i => 2 }) == 0;
    if ($inserted == 1 && $gone) { $settled = 1; last }
    select(undef, undef, undef, 0.05);
}
fail("fire-and-forget OP_INSERT / OP_UPDATE / OP_DELETE did not all apply") unless $settled;
ok("OP_INSERT, OP_UPDATE and OP_DELETE applied");

# A blocked fire-and-forget write has no reply channel: dropped (recorded), nothing applied.
$w0->update_many({}, { '$set' => { everything => 1 } });
$w0->delete_many({});
select(undef, undef, undef, 0.3);
my $touched = $coll->count_documents({ everything => 1 });
my $left = $coll->count_documents({ run => $run });
fail("a blocked OP_UPDATE reached the server ($touched documents)") if $touched;
fail("a blocked OP_DELETE reached the server ($left documents left)") unless $left == 249;
ok("blocked OP_UPDATE / OP_DELETE without a filter were dropped");

# A blocked acknowledged command: a clear error, once (no retry).
my $err = try { $coll->update_many({}, { '$set' => { y => 1 } }); undef } catch { $_ };
fail("update_many without a filter was not blocked") unless $err;
my $msg = ref $err && $err->can("message") ? $err->message : "$err";
fail("blocked with an unclear error: $msg") unless $msg =~ /W001/;
ok("blocked: " . (split /\n/, $msg)[0]);

# Compression: the driver offers zlib when the URI asks (mongoguard counts it; the harness checks).
my $zc = MongoDB->connect($ENV{MG_URI} . ($ENV{MG_URI} =~ /\?/ ? "&" : "?") . "compressors=zlib");
my $n = $zc->get_database("sdk_perl")->get_collection("t_perl")->count_documents({ run => $run });
fail("count over zlib: $n") unless $n == 249;
ok("count over a zlib connection");
