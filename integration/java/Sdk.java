// The MongoDB Java driver 3.6 (Debian's libmongodb-java: the driver generation legacy
// applications run; its handshake is an OP_QUERY isMaster, it authenticates with SCRAM-SHA-1)
// through mongoguard, unmodified. Run by integration/run_sdks.sh: MG_URI is the connection
// string to mongoguard, MG_MODE the mode's name, MG_STANDIN_URI a direct connection to the
// stand-in upstream (for its counters), MG_COMPRESSION "1" when compressed messages reach the upstream as sent (passthrough).

import com.mongodb.MongoClient;
import com.mongodb.MongoClientOptions;
import com.mongodb.MongoClientURI;
import com.mongodb.MongoCommandException;
import com.mongodb.client.MongoCollection;
import com.mongodb.client.MongoCursor;
import com.mongodb.client.model.Filters;
import com.mongodb.client.model.Updates;
import com.mongodb.event.CommandFailedEvent;
import com.mongodb.event.CommandListener;
import com.mongodb.event.CommandStartedEvent;
import com.mongodb.event.CommandSucceededEvent;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import org.bson.Document;

public class Sdk {
    static final String MODE = System.getenv("MG_MODE");
    static final ConcurrentHashMap<String, AtomicLong> STARTED = new ConcurrentHashMap<>();

    static void fail(String msg) {
        System.err.println("java/" + MODE + ": FAIL: " + msg);
        System.exit(1);
    }

    static void ok(String msg) {
        System.out.println("java/" + MODE + ": ok: " + msg);
    }

    static long started(String name) {
        AtomicLong n = STARTED.get(name);
        return n == null ? 0 : n.get();
    }

    static long standinCompressed() {
        MongoClient direct = new MongoClient(new MongoClientURI(System.getenv("MG_STANDIN_URI")));
        try {
            Document stats = direct.getDatabase("admin").runCommand(new Document("standinStats", 1));
            return ((Number) stats.get("compressedMessages")).longValue();
        } finally {
            direct.close();
        }
    }

    public static void main(String[] args) {
        CommandListener listener = new CommandListener() {
            public void commandStarted(CommandStartedEvent e) {
                STARTED.computeIfAbsent(e.getCommandName(), k -> new AtomicLong()).incrementAndGet();
            }
            public void commandSucceeded(CommandSucceededEvent e) {}
            public void commandFailed(CommandFailedEvent e) {}
        };
        long compressedBefore = standinCompressed();
        MongoClientOptions.Builder options = MongoClientOptions.builder()
            .addCommandListener(listener).applicationName("sdk-java")
            .serverSelectionTimeout(10000).connectTimeout(5000).socketTimeout(30000);
        MongoClient client = new MongoClient(new MongoClientURI(System.getenv("MG_URI"), options));
        try {
            client.getDatabase("admin").runCommand(new Document("ping", 1));
            ok("connected and authenticated");
            MongoCollection<Document> coll = client.getDatabase("sdk_java").getCollection("t_java");
            String run = MODE + "-" + System.nanoTime();
            List<Document> docs = new ArrayList<>();
            for (int i = 0; i < 250; i++) {
                docs.add(new Document("run", run).append("i", i).append("pad", "x".repeat(100)));
            }
            coll.insertMany(docs);
            int seen = 0;
            MongoCursor<Document> cur = coll.find(Filters.eq("run", run)).batchSize(50).iterator();
            while (cur.hasNext()) {
                cur.next();
                seen++;
            }
            cur.close();
            if (seen != 250 || started("getMore") < 4) {
                fail("cursor: " + seen + " documents, " + started("getMore") + " getMore");
            }
            ok("250 documents through a cursor of batch 50 (" + started("getMore") + " getMore)");
            if (coll.updateOne(Filters.and(Filters.eq("run", run), Filters.eq("i", 0)), Updates.set("x", 1)).getModifiedCount() != 1) {
                fail("updateOne");
            }
            Document got = coll.find(Filters.and(Filters.eq("run", run), Filters.eq("i", 0))).first();
            if (got == null || !Integer.valueOf(1).equals(got.get("x"))) {
                fail("find after update: " + got);
            }
            if (coll.deleteOne(Filters.and(Filters.eq("run", run), Filters.eq("i", 1))).getDeletedCount() != 1) {
                fail("deleteOne");
            }
            if (coll.count(Filters.eq("run", run)) != 249) {
                fail("count");
            }
            ok("CRUD");

            long before = started("update");
            try {
                coll.updateMany(new Document(), Updates.set("y", 1));
                fail("updateMany({}) was not refused");
            } catch (MongoCommandException e) {
                if (e.getErrorCode() != 65001 || !e.getErrorMessage().contains("W001")
                        || !e.getErrorMessage().contains("Instead: ")) {
                    fail("blocked error: " + e.getErrorCode() + " " + e.getErrorMessage());
                }
                if (started("update") - before != 1) {
                    fail("the blocked update was sent " + (started("update") - before) + " times");
                }
                ok("blocked: " + e.getErrorMessage());
            }
            coll.deleteMany(Filters.eq("run", run));
        } finally {
            client.close();
        }
        long compressed = standinCompressed() - compressedBefore;
        if ("1".equals(System.getenv("MG_COMPRESSION"))) {
            if (compressed < 5) {
                fail("compression: the stand-in saw " + compressed + " compressed messages");
            }
            ok("compression: " + compressed + " compressed messages reached the upstream");
        } else {
            ok("compression: the upstream gets requests decompressed in this mode (" + compressed + " compressed); the harness counts them on mongoguard");
        }
    }
}
