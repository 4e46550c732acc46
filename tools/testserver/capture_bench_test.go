package testserver

import (
	"context"
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// BenchmarkCapture measures what capturing change events costs a write:
// a findOneAndUpdate loop on one document, with change streams off (the
// plain serializing proxy) and on (each write read before and after, its
// event recorded; no stream open). Compare the two rows' ns/op.
func BenchmarkCapture(b *testing.B) {
	for _, tc := range []struct {
		name string
		on   bool
	}{{"changestreams=off", false}, {"changestreams=on", true}} {
		b.Run(tc.name, func(b *testing.B) {
			srv, err := Start(Config{Dir: b.TempDir(), ChangeStreams: tc.on})
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			ctx := context.Background()
			c, err := mongo.Connect(options.Client().ApplyURI(srv.URI()))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Disconnect(ctx)
			coll := c.Database("bench").Collection("capture")
			filter := bson.D{{Key: "_id", Value: "k"}}
			update := bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}
			opts := options.FindOneAndUpdate().SetUpsert(true)
			if err := coll.FindOneAndUpdate(ctx, filter, update, opts).Err(); err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := coll.FindOneAndUpdate(ctx, filter, update, opts).Err(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
