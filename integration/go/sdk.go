// The Go driver (go.mongodb.org/mongo-driver, Debian's golang-mongodb-mongo-driver-dev)
// through mongoguard, unmodified. Run by integration/run_sdks.sh in GOPATH mode (no module
// proxy is reachable): MG_URI is the connection string to mongoguard, MG_MODE the mode's name,
// MG_STANDIN_URI a direct connection to the stand-in upstream (for its counters),
// MG_COMPRESSION "1" when compressed messages reach the upstream as sent (passthrough).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/event"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/version"
)

var mode = os.Getenv("MG_MODE")

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "go/"+mode+": FAIL: "+format+"\n", args...)
	os.Exit(1)
}

func ok(format string, args ...interface{}) {
	fmt.Printf("go/"+mode+": ok: "+format+"\n", args...)
}

func standinCompressed(ctx context.Context) int64 {
	c, err := mongo.Connect(ctx, options.Client().ApplyURI(os.Getenv("MG_STANDIN_URI")))
	if err != nil {
		fail("direct connection to the stand-in: %v", err)
	}
	defer c.Disconnect(ctx)
	var stats bson.M
	if err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "standinStats", Value: 1}}).Decode(&stats); err != nil {
		fail("standinStats: %v", err)
	}
	n, _ := stats["compressedMessages"].(int64)
	return n
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var started = map[string]*int64{"getMore": new(int64), "update": new(int64)}
	monitor := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if n, found := started[e.CommandName]; found {
			atomic.AddInt64(n, 1)
		}
	}}
	compressedBefore := standinCompressed(ctx)
	opts := options.Client().ApplyURI(os.Getenv("MG_URI")).SetMonitor(monitor).
		SetCompressors([]string{"zstd", "zlib", "snappy"}).SetAppName("sdk-go")
	client, err := mongo.Connect(ctx, opts)
	if err != nil {
		fail("connect: %v", err)
	}
	defer client.Disconnect(ctx)
	if err := client.Ping(ctx, nil); err != nil {
		fail("ping (authentication in pooled mode): %v", err)
	}
	ok("connected and authenticated, driver %s", version.Driver)

	coll := client.Database("sdk_go").Collection("t_go")
	run := fmt.Sprintf("%s-%d", mode, time.Now().UnixNano())
	docs := make([]interface{}, 250)
	for i := range docs {
		docs[i] = bson.D{{Key: "run", Value: run}, {Key: "i", Value: i}, {Key: "pad", Value: strings.Repeat("x", 100)}}
	}
	if res, err := coll.InsertMany(ctx, docs); err != nil || len(res.InsertedIDs) != 250 {
		fail("insertMany: %v", err)
	}
	cur, err := coll.Find(ctx, bson.M{"run": run}, options.Find().SetBatchSize(50))
	if err != nil {
		fail("find: %v", err)
	}
	seen := 0
	for cur.Next(ctx) {
		seen++
	}
	if err := cur.Err(); err != nil || seen != 250 {
		fail("cursor: %d documents, %v", seen, err)
	}
	if g := atomic.LoadInt64(started["getMore"]); g < 4 {
		fail("cursor past its first batch: %d getMore", g)
	}
	ok("250 documents through a cursor of batch 50 (%d getMore)", atomic.LoadInt64(started["getMore"]))
	if r, err := coll.UpdateOne(ctx, bson.M{"run": run, "i": 0}, bson.M{"$set": bson.M{"x": 1}}); err != nil || r.ModifiedCount != 1 {
		fail("updateOne: %v", err)
	}
	var got bson.M
	if err := coll.FindOne(ctx, bson.M{"run": run, "i": 0}).Decode(&got); err != nil || got["x"] != int32(1) {
		fail("findOne after update: %v %v", got, err)
	}
	if r, err := coll.DeleteOne(ctx, bson.M{"run": run, "i": 1}); err != nil || r.DeletedCount != 1 {
		fail("deleteOne: %v", err)
	}
	if n, err := coll.CountDocuments(ctx, bson.M{"run": run}); err != nil || n != 249 {
		fail("countDocuments: %d %v", n, err)
	}
	ok("CRUD")

	// A blocked command: a clear error, code 65001, no retry.
	before := atomic.LoadInt64(started["update"])
	_, err = coll.UpdateMany(ctx, bson.M{}, bson.M{"$set": bson.M{"y": 1}})
	var ce mongo.CommandError
	if !errors.As(err, &ce) {
		fail("updateMany({}) must be refused with a command error, got %T %v", err, err)
	}
	if ce.Code != 65001 || !strings.Contains(ce.Message, "W001") || !strings.Contains(ce.Message, "Instead: ") {
		fail("blocked error: code %d %q", ce.Code, ce.Message)
	}
	if n := atomic.LoadInt64(started["update"]) - before; n != 1 {
		fail("the blocked update was sent %d times (a retry)", n)
	}
	if ce.HasErrorLabel("RetryableWriteError") {
		fail("a block carries a retryable label")
	}
	ok("blocked: %s", ce.Message)

	if _, err := coll.DeleteMany(ctx, bson.M{"run": run}); err != nil {
		fail("cleanup deleteMany: %v", err)
	}
	compressed := standinCompressed(ctx) - compressedBefore
	if os.Getenv("MG_COMPRESSION") == "1" {
		if compressed < 5 {
			fail("compression: the stand-in saw %d compressed messages", compressed)
		}
		ok("compression: %d compressed messages reached the upstream", compressed)
	} else {
		ok("compression: the upstream gets requests decompressed in this mode (%d compressed); the harness counts them on mongoguard", compressed)
	}
}
