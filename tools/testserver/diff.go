package testserver

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// updateDescription returns what an update event says changed from old to
// cur: updatedFields (new and changed fields), removedFields and
// truncatedArrays. A change inside an embedded document is reported by its
// dotted path when the update named a path inside it (paths: the fields of
// its operators, as {$set: {"a.b": 1}}), and as the whole embedded
// document otherwise ({$set: {a: {b: 1}}}), as MongoDB reports them. An array that changed is reported whole, as MongoDB
// reports an array that a $set replaced (its finer array diffs, such as
// "a.3" for a $push, are not emulated). It reports whether anything
// changed.
func updateDescription(old, cur bson.Raw, paths []string) (bson.D, bool, error) {
	var updated bson.D
	removed := bson.A{}
	if err := diffDocs("", old, cur, paths, &updated, &removed); err != nil {
		return nil, false, err
	}
	if len(updated) == 0 && len(removed) == 0 {
		return nil, false, nil
	}
	if updated == nil {
		updated = bson.D{}
	}
	return bson.D{
		{Key: "updatedFields", Value: updated},
		{Key: "removedFields", Value: removed},
		{Key: "truncatedArrays", Value: bson.A{}},
	}, true, nil
}

func diffDocs(prefix string, old, cur bson.Raw, paths []string, updated *bson.D, removed *bson.A) error {
	oldElems, err := old.Elements()
	if err != nil {
		return err
	}
	curElems, err := cur.Elements()
	if err != nil {
		return err
	}
	oldByKey := make(map[string]bson.RawValue, len(oldElems))
	for _, e := range oldElems {
		oldByKey[e.Key()] = e.Value()
	}
	seen := make(map[string]bool, len(curElems))
	for _, e := range curElems {
		k, v := e.Key(), e.Value()
		seen[k] = true
		was, ok := oldByKey[k]
		switch {
		case !ok:
			*updated = append(*updated, bson.E{Key: prefix + k, Value: v})
		case was.Type == bson.TypeEmbeddedDocument && v.Type == bson.TypeEmbeddedDocument && within(paths, prefix+k+"."):
			if err := diffDocs(prefix+k+".", was.Document(), v.Document(), paths, updated, removed); err != nil {
				return err
			}
		case !was.Equal(v):
			*updated = append(*updated, bson.E{Key: prefix + k, Value: v})
		}
	}
	for _, e := range oldElems {
		if !seen[e.Key()] {
			*removed = append(*removed, prefix+e.Key())
		}
	}
	return nil
}

// within reports whether any of paths lies under prefix (which ends in a dot).
func within(paths []string, prefix string) bool {
	for _, p := range paths {
		if strings.HasPrefix(p, prefix) {
			return true
		}
	}
	return false
}

// updatePaths returns the paths an update document's operators name
// ({$set: {"a.b": 1}, $inc: {n: 1}} names a.b and n).
func updatePaths(u bson.Raw) []string {
	var paths []string
	ops, _ := u.Elements()
	for _, op := range ops {
		fields, ok := op.Value().DocumentOK()
		if !ok {
			continue
		}
		elems, _ := fields.Elements()
		for _, f := range elems {
			paths = append(paths, f.Key())
		}
	}
	return paths
}
