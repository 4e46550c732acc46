package testserver

import (
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// stage is one stage after $changeStream in a stream's pipeline: it passes
// an event on (changed or not) or drops it.
type stage func(ev bson.Raw) (bson.Raw, bool, error)

// parseStages returns the stages after $changeStream: $match and $project.
// Any other stage is an errUnsupported, answered when the stream opens.
func parseStages(pipeline []bson.RawValue) ([]stage, error) {
	var stages []stage
	for _, v := range pipeline {
		doc, ok := v.DocumentOK()
		if !ok {
			return nil, fmt.Errorf("testserver: a pipeline stage must be a document")
		}
		elems, err := doc.Elements()
		if err != nil || len(elems) != 1 {
			return nil, fmt.Errorf("testserver: a pipeline stage must have exactly one field")
		}
		name, arg := elems[0].Key(), elems[0].Value()
		spec, ok := arg.DocumentOK()
		if !ok {
			return nil, fmt.Errorf("testserver: the argument of %s must be a document", name)
		}
		switch name {
		case "$match":
			stages = append(stages, func(ev bson.Raw) (bson.Raw, bool, error) {
				ok, err := matches(ev, spec)
				return ev, ok, err
			})
		case "$project":
			p, err := parseProjection(spec)
			if err != nil {
				return nil, err
			}
			stages = append(stages, func(ev bson.Raw) (bson.Raw, bool, error) {
				out, err := p.apply(ev)
				return out, err == nil, err
			})
		default:
			return nil, errUnsupported{"pipeline stage " + name}
		}
	}
	return stages, nil
}

// projection is a parsed $project of field paths: inclusion (a: 1) or
// exclusion (a: 0), with _id included unless excluded.
type projection struct {
	include bool
	fields  pathTree
	noID    bool // _id: 0 was given
}

// pathTree holds dotted paths: a.b and a.c as a: {b, c}; a nil subtree is
// a leaf (the whole field).
type pathTree map[string]pathTree

func (t pathTree) add(path []string) {
	sub, ok := t[path[0]]
	if len(path) == 1 {
		t[path[0]] = nil
		return
	}
	if ok && sub == nil {
		return
	}
	if sub == nil {
		sub = pathTree{}
		t[path[0]] = sub
	}
	sub.add(path[1:])
}

func parseProjection(spec bson.Raw) (*projection, error) {
	p := &projection{fields: pathTree{}}
	elems, err := spec.Elements()
	if err != nil {
		return nil, err
	}
	mode := 0 // 1 inclusion, -1 exclusion
	for _, e := range elems {
		v := e.Value()
		on, isFlag := v.BooleanOK()
		if n, ok := v.AsInt64OK(); ok {
			on, isFlag = n != 0, true
		}
		if !isFlag {
			return nil, errUnsupported{"$project expression for " + e.Key()}
		}
		if e.Key() == "_id" && !on {
			p.noID = true
			continue
		}
		m := -1
		if on {
			m = 1
		}
		if mode != 0 && m != mode {
			return nil, fmt.Errorf("testserver: $project cannot mix inclusion and exclusion")
		}
		mode = m
		p.fields.add(strings.Split(e.Key(), "."))
	}
	p.include = mode == 1
	if p.include != p.noID { // _id kept by an inclusion, dropped by an exclusion
		p.fields["_id"] = nil
	}
	return p, nil
}

func (p *projection) apply(doc bson.Raw) (bson.Raw, error) {
	d, err := project(doc, p.fields, p.include)
	if err != nil {
		return nil, err
	}
	return bson.Marshal(d)
}

// project keeps (include) or drops the fields of doc that tree names.
func project(doc bson.Raw, tree pathTree, include bool) (bson.D, error) {
	elems, err := doc.Elements()
	if err != nil {
		return nil, err
	}
	out := bson.D{}
	for _, e := range elems {
		sub, named := tree[e.Key()]
		v := e.Value()
		switch {
		case named && sub == nil:
			if include {
				out = append(out, bson.E{Key: e.Key(), Value: v})
			}
		case named && v.Type == bson.TypeEmbeddedDocument:
			inner, err := project(v.Document(), sub, include)
			if err != nil {
				return nil, err
			}
			out = append(out, bson.E{Key: e.Key(), Value: inner})
		case !include:
			out = append(out, bson.E{Key: e.Key(), Value: v})
		}
	}
	return out, nil
}
