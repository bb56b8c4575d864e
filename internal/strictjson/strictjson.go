// Package strictjson refuses what encoding/json accepts silently in a
// request body, reading something other than what it says: bytes that are
// not UTF-8 and a \u escape of half a UTF-16 surrogate pair (both read as
// U+FFFD: "t\ud800" relayed to a target nobody named), an object key that
// names a field only when compared without case ("PUTS" for "puts"), and
// a key that appears twice in one object. encoding/json matches names
// case-insensitively and keeps the last of repeated keys, and
// DisallowUnknownFields catches neither, so {"through":1,"Through":3}
// skipped three rows and {"target":"a","TARGET":"b"} relayed to b.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// Check reports what in data, a JSON document meant for v (a pointer, as
// for json.Unmarshal), encoding/json would read other than as written:
// bytes that are not UTF-8, half a surrogate pair, and the first key that
// is repeated within its object or names none of its struct's fields
// exactly. Everything else (syntax, types, unknown fields) is left to the
// decoder, which reports it better: Check returns nil for what it cannot
// tokenize.
func Check(data []byte, v any) error {
	if !utf8.Valid(data) {
		return errors.New("not valid UTF-8, which JSON text must be (a name or key of other bytes cannot travel in a JSON string)")
	}
	if at := loneSurrogate(data); at >= 0 {
		return fmt.Errorf("%s at byte %d is half of a UTF-16 surrogate pair, which stands for no character (JSON would read it as U+FFFD)", data[at:at+6], at)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	err := walk(dec, reflect.TypeOf(v))
	if _, ok := err.(*keyError); ok {
		return err
	}
	return nil
}

type keyError struct{ msg string }

func (e *keyError) Error() string { return e.msg }

// walk reads one value from dec, checking object keys against t (nil:
// any keys, only repeats are refused).
func walk(dec *json.Decoder, t reflect.Type) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil // a scalar
	}
	switch d {
	case '[':
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for dec.More() {
			if err := walk(dec, elem); err != nil {
				return err
			}
		}
	case '{':
		var fields map[string]reflect.Type
		var elem reflect.Type
		switch {
		case t != nil && t.Kind() == reflect.Struct:
			fields = fieldsOf(t)
		case t != nil && t.Kind() == reflect.Map:
			elem = t.Elem()
		}
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := tok.(string)
			if seen[key] {
				return &keyError{fmt.Sprintf("field %q appears twice in one object", key)}
			}
			seen[key] = true
			next := elem
			if fields != nil {
				ft, exact := fields[key]
				if !exact {
					for name := range fields {
						if strings.EqualFold(name, key) {
							return &keyError{fmt.Sprintf("unknown field %q (field names are case-sensitive: %q)", key, name)}
						}
					}
				}
				next = ft // an unknown field is the decoder's to refuse
			}
			if err := walk(dec, next); err != nil {
				return err
			}
		}
	}
	_, err = dec.Token() // the closing delimiter
	return err
}

var cache sync.Map // reflect.Type → map[string]reflect.Type

// fieldsOf maps the JSON names of struct t's fields (embedded structs'
// included, as encoding/json promotes them) to their types.
func fieldsOf(t reflect.Type) map[string]reflect.Type {
	if m, ok := cache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		ft := f.Type
		if f.Anonymous && name == "" {
			et := ft
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for n, typ := range fieldsOf(et) {
					if _, ok := m[n]; !ok {
						m[n] = typ
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = ft
	}
	cache.Store(t, m)
	return m
}

// loneSurrogate returns the offset of the first \u escape in body that is
// a surrogate without its other half, or -1. A backslash occurs only in
// strings of valid JSON, each one escape; malformed escapes are left to
// the decoder.
func loneSurrogate(body []byte) int {
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		r, ok := escapedUnit(body, i)
		switch {
		case !ok:
			i++ // another escape: skip its character
		case r >= 0xd800 && r < 0xdc00:
			if lo, ok := escapedUnit(body, i+6); !ok || lo < 0xdc00 || lo >= 0xe000 {
				return i
			}
			i += 11
		case r >= 0xdc00 && r < 0xe000:
			return i
		default:
			i += 5
		}
	}
	return -1
}

// escapedUnit reads a \uXXXX escape at body[i:].
func escapedUnit(body []byte, i int) (rune, bool) {
	if i+6 > len(body) || body[i] != '\\' || body[i+1] != 'u' {
		return 0, false
	}
	v, err := strconv.ParseUint(string(body[i+2:i+6]), 16, 16)
	return rune(v), err == nil
}
