// mgo (gopkg.in/mgo.v2 r2016.08.01, Debian's golang-gopkg-mgo.v2-dev): the Go driver legacy
// applications still run. It speaks the old opcodes: OP_QUERY for commands (and for queries
// against servers before 3.2), OP_INSERT / OP_UPDATE / OP_DELETE followed by getLastError
// against servers before 2.6, OP_GET_MORE for cursors; SCRAM-SHA-1 over OP_QUERY. Run by
// integration/run_sdks.sh against a stand-in that reports an old wire version, through
// mongoguard: MG_ADDR, MG_USER / MG_PASSWORD (pooled mode), MG_MODE.
package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	mgo "gopkg.in/mgo.v2"
	"gopkg.in/mgo.v2/bson"
)

var mode = os.Getenv("MG_MODE")

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "mgo/"+mode+": FAIL: "+format+"\n", args...)
	os.Exit(1)
}

func ok(format string, args ...interface{}) {
	fmt.Printf("mgo/"+mode+": ok: "+format+"\n", args...)
}

func main() {
	info := &mgo.DialInfo{
		Addrs:    []string{os.Getenv("MG_ADDR")},
		Direct:   true,
		Timeout:  10 * time.Second,
		Username: os.Getenv("MG_USER"),
		Password: os.Getenv("MG_PASSWORD"),
		Source:   "admin",
	}
	if os.Getenv("MG_DEBUG") != "" {
		mgo.SetLogger(logger{})
		mgo.SetDebug(true)
	}
	session, err := mgo.DialWithInfo(info)
	if err != nil {
		fail("dial (authentication in pooled mode): %v", err)
	}
	defer session.Close()
	session.SetSocketTimeout(30 * time.Second)
	bi, err := session.BuildInfo()
	if err != nil {
		fail("buildInfo: %v", err)
	}
	ok("connected and authenticated; server %s", bi.Version)

	coll := session.DB("sdk_mgo").C("t_mgo")
	run := fmt.Sprintf("%s-%d", mode, time.Now().UnixNano())
	docs := make([]interface{}, 250)
	for i := range docs {
		docs[i] = bson.M{"run": run, "i": i, "pad": strings.Repeat("x", 100)}
	}
	if err := coll.Insert(docs...); err != nil {
		fail("insert: %v", err)
	}
	iter := coll.Find(bson.M{"run": run}).Batch(50).Iter()
	seen := 0
	var d bson.M
	for iter.Next(&d) {
		seen++
	}
	if err := iter.Close(); err != nil || seen != 250 {
		fail("cursor: %d documents, %v", seen, err)
	}
	ok("250 documents through a cursor of batch 50")
	if err := coll.Update(bson.M{"run": run, "i": 0}, bson.M{"$set": bson.M{"x": 1}}); err != nil {
		fail("update: %v", err)
	}
	var got bson.M
	if err := coll.Find(bson.M{"run": run, "i": 0}).One(&got); err != nil || got["x"] != 1 {
		fail("find after update: %v %v", got, err)
	}
	if err := coll.Remove(bson.M{"run": run, "i": 1}); err != nil {
		fail("remove: %v", err)
	}
	if n, err := coll.Find(bson.M{"run": run}).Count(); err != nil || n != 249 {
		fail("count: %d %v", n, err)
	}
	ok("CRUD")

	_, err = coll.UpdateAll(bson.M{}, bson.M{"$set": bson.M{"y": 1}})
	if err == nil || !strings.Contains(err.Error(), "W001") || !strings.Contains(err.Error(), "Instead: ") {
		fail("updateAll({}) must be refused with W001, got %v", err)
	}
	if le, isLastError := err.(*mgo.LastError); isLastError && le.Code != 65001 {
		fail("blocked error code %d: %v", le.Code, err)
	}
	if qe, isQueryError := err.(*mgo.QueryError); isQueryError && qe.Code != 65001 {
		fail("blocked error code %d: %v", qe.Code, err)
	}
	if n, err := coll.Find(bson.M{"y": 1}).Count(); err != nil || n != 0 {
		fail("the blocked update reached the data: %d documents changed (%v)", n, err)
	}
	ok("blocked (%T): %v", err, err)
	if _, err := coll.RemoveAll(bson.M{"run": run}); err != nil {
		fail("cleanup: %v", err)
	}
	ok("compression: mgo has none")
}

type logger struct{}

func (logger) Output(_ int, s string) error {
	fmt.Fprintln(os.Stderr, s)
	return nil
}
