package testserver

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// errUnsupported answers a query or stage the emulation does not evaluate.
type errUnsupported struct{ what string }

func (e errUnsupported) Error() string {
	return "testserver: " + e.what + " is not supported by the emulated change stream"
}

// matches evaluates a query filter on doc, for the $match stages of a
// change stream (and to tell which statement of a bulk write a document
// belongs to). It knows $eq $ne $gt $gte $lt $lte $in $nin $exists $not,
// $and $or $nor, dotted paths through documents and arrays, and implicit
// equality on documents and arrays; anything else is an errUnsupported.
func matches(doc, filter bson.Raw) (bool, error) {
	elems, err := filter.Elements()
	if err != nil {
		return false, err
	}
	for _, e := range elems {
		ok, err := matchElem(doc, e.Key(), e.Value())
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

func matchElem(doc bson.Raw, key string, v bson.RawValue) (bool, error) {
	switch key {
	case "$and", "$or", "$nor":
		return matchLogical(doc, key, v)
	}
	if strings.HasPrefix(key, "$") {
		return false, errUnsupported{"query operator " + key}
	}
	vals, found := resolve(bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: doc}, strings.Split(key, "."))
	if ops, ok := v.DocumentOK(); ok && isOperatorDoc(ops) {
		elems, _ := ops.Elements()
		for _, op := range elems {
			ok, err := matchOp(vals, found, op.Key(), op.Value())
			if err != nil || !ok {
				return false, err
			}
		}
		return true, nil
	}
	return equalAny(vals, found, v), nil
}

func isOperatorDoc(d bson.Raw) bool {
	e, err := d.IndexErr(0)
	return err == nil && strings.HasPrefix(e.Key(), "$")
}

func matchLogical(doc bson.Raw, op string, v bson.RawValue) (bool, error) {
	arr, ok := v.ArrayOK()
	if !ok {
		return false, fmt.Errorf("testserver: %s must be an array", op)
	}
	subs, err := arr.Values()
	if err != nil || len(subs) == 0 {
		return false, fmt.Errorf("testserver: %s must be a nonempty array", op)
	}
	for _, s := range subs {
		f, ok := s.DocumentOK()
		if !ok {
			return false, fmt.Errorf("testserver: %s entries must be documents", op)
		}
		m, err := matches(doc, f)
		if err != nil {
			return false, err
		}
		switch {
		case op == "$and" && !m:
			return false, nil
		case op == "$or" && m:
			return true, nil
		case op == "$nor" && m:
			return false, nil
		}
	}
	return op != "$or", nil
}

func matchOp(vals []bson.RawValue, found bool, op string, arg bson.RawValue) (bool, error) {
	switch op {
	case "$eq":
		return equalAny(vals, found, arg), nil
	case "$ne":
		return !equalAny(vals, found, arg), nil
	case "$gt", "$gte", "$lt", "$lte":
		for _, v := range vals {
			if c, ok := compare(v, arg); ok && (op == "$gt" && c > 0 || op == "$gte" && c >= 0 || op == "$lt" && c < 0 || op == "$lte" && c <= 0) {
				return true, nil
			}
		}
		return false, nil
	case "$in", "$nin":
		arr, ok := arg.ArrayOK()
		if !ok {
			return false, fmt.Errorf("testserver: %s needs an array", op)
		}
		opts, _ := arr.Values()
		in := false
		for _, o := range opts {
			in = in || equalAny(vals, found, o)
		}
		return in == (op == "$in"), nil
	case "$exists":
		want := arg.Type != bson.TypeBoolean || arg.Boolean()
		if n, ok := arg.AsInt64OK(); ok {
			want = n != 0
		}
		return found == want, nil
	case "$not":
		sub, ok := arg.DocumentOK()
		if !ok {
			return false, errUnsupported{"$not of a non-document"}
		}
		elems, _ := sub.Elements()
		for _, e := range elems {
			m, err := matchOp(vals, found, e.Key(), e.Value())
			if err != nil || !m {
				return err == nil, err
			}
		}
		return false, nil
	}
	return false, errUnsupported{"query operator " + op}
}

// resolve returns the values a dotted path reaches in v, looking through
// arrays as MongoDB does (a.b reaches the b of each document in array a;
// a.1 reaches its second element), and whether the path exists. An array
// at the end of the path yields itself and each of its elements.
func resolve(v bson.RawValue, path []string) ([]bson.RawValue, bool) {
	if len(path) == 0 {
		if arr, ok := v.ArrayOK(); ok {
			elems, _ := arr.Values()
			return append([]bson.RawValue{v}, elems...), true
		}
		return []bson.RawValue{v}, true
	}
	switch v.Type {
	case bson.TypeEmbeddedDocument:
		next, err := v.Document().LookupErr(path[0])
		if err != nil {
			return nil, false
		}
		return resolve(next, path[1:])
	case bson.TypeArray:
		elems, _ := v.Array().Values()
		if i, err := strconv.Atoi(path[0]); err == nil && i >= 0 && i < len(elems) {
			return resolve(elems[i], path[1:])
		}
		var out []bson.RawValue
		found := false
		for _, e := range elems {
			if e.Type == bson.TypeEmbeddedDocument {
				vals, ok := resolve(e, path)
				out, found = append(out, vals...), found || ok
			}
		}
		return out, found
	}
	return nil, false
}

// equalAny reports whether any of vals equals want; null also matches a
// missing path, as in MongoDB.
func equalAny(vals []bson.RawValue, found bool, want bson.RawValue) bool {
	if want.Type == bson.TypeNull && !found {
		return true
	}
	for _, v := range vals {
		if c, ok := compare(v, want); ok && c == 0 {
			return true
		}
	}
	return false
}

// compare orders two values of the same kind (numbers of any type
// together, strings, dates, timestamps, ObjectIDs, booleans); values of
// other kinds are equal only when their bytes are, and otherwise
// incomparable.
func compare(a, b bson.RawValue) (int, bool) {
	if a.IsNumber() && b.IsNumber() {
		x, y := number(a), number(b)
		switch {
		case x < y:
			return -1, true
		case x > y:
			return 1, true
		}
		return 0, true
	}
	if a.Type != b.Type {
		return 0, false
	}
	switch a.Type {
	case bson.TypeString:
		return strings.Compare(a.StringValue(), b.StringValue()), true
	case bson.TypeDateTime:
		return cmpInt(a.DateTime(), b.DateTime()), true
	case bson.TypeTimestamp:
		at, ai := a.Timestamp()
		bt, bi := b.Timestamp()
		if at != bt {
			return cmpInt(int64(at), int64(bt)), true
		}
		return cmpInt(int64(ai), int64(bi)), true
	case bson.TypeObjectID, bson.TypeBoolean:
		return bytes.Compare(a.Value, b.Value), true
	}
	if bytes.Equal(a.Value, b.Value) {
		return 0, true
	}
	return 0, false
}

func number(v bson.RawValue) float64 {
	if f, ok := v.DoubleOK(); ok {
		return f
	}
	if n, ok := v.AsInt64OK(); ok {
		return float64(n)
	}
	return 0
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
