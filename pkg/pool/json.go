package pool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"unicode/utf8"
)

// value is one decoded JSON value that remembers where it came from, so
// every error can name the field ("resourceList[0].selectors.pfNames[1]").
type value struct {
	path string
	v    any // *object, []*value, string, json.Number, bool, nil
}

// object is a JSON object with its keys in file order.
type object struct {
	keys []string
	vals map[string]*value // by exact key
}

// The config's limits (issue 44, finding 7): the largest config in
// testdata/config is 589 bytes nested 5 deep (object, list, entry,
// selectors, list); a node with 64 pools of such entries is some 40 KiB.
// MaxConfigSize is 16 times that, MaxConfigDepth three times the depth a
// config has. Without them a 72 KB document nested 12,000 deep took 150 MB
// to parse, against the DaemonSet's 256 Mi memory limit.
const (
	MaxConfigSize  = 640 << 10
	MaxConfigDepth = 16
)

// ErrConfigTooLarge is the error for a config over MaxConfigSize bytes or
// nested deeper than MaxConfigDepth.
var ErrConfigTooLarge = errors.New("pool config too large")

// decode parses one JSON document into a value tree. Duplicate keys, also
// ones that differ only in case (the config's keys match case-insensitively,
// so "isRdma" and "IsRdma" are the same key), are an error.
func decode(data []byte) (*value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if len(data) > MaxConfigSize {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d (a config lists pools, not devices: split it or use broader selectors)", ErrConfigTooLarge, len(data), MaxConfigSize)
	}
	v, err := decodeValue(dec, "", 1)
	if se := (*jsonSyntaxError)(nil); errors.As(err, &se) {
		return nil, fmt.Errorf("invalid JSON at %s: %w", position(data, se.offset), se.err)
	}
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("unexpected data after the top-level JSON object at %s", position(data, dec.InputOffset()))
	}
	return v, nil
}

// jsonSyntaxError is a syntax error at a byte offset of the input;
// decode says where as a line and column.
type jsonSyntaxError struct {
	offset int64
	err    error
}

func (e *jsonSyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON near offset %d: %v", e.offset, e.err)
}

func (e *jsonSyntaxError) Unwrap() error { return e.err }

// position is "line L, column C" of byte offset off in data, both from 1,
// the column in characters, as editors count them.
func position(data []byte, off int64) string {
	off = min(max(off, 0), int64(len(data)))
	before := data[:off]
	line := bytes.Count(before, []byte("\n")) + 1
	col := utf8.RuneCount(before[bytes.LastIndexByte(before, '\n')+1:]) + 1
	return fmt.Sprintf("line %d, column %d", line, col)
}

func decodeValue(dec *json.Decoder, path string, depth int) (*value, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, syntaxError(err, dec)
	}
	switch t := tok.(type) {
	case json.Delim:
		if depth > MaxConfigDepth && (t == '{' || t == '[') {
			return nil, fmt.Errorf("%w: nested deeper than %d objects and lists at offset %d (%s)", ErrConfigTooLarge, MaxConfigDepth, dec.InputOffset(), path)
		}
		switch t {
		case '{':
			obj := &object{vals: map[string]*value{}}
			folded := map[string]string{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, syntaxError(err, dec)
				}
				key := kt.(string) // the decoder only returns strings as object keys
				sub := join(path, key)
				if prev, ok := folded[strings.ToLower(key)]; ok {
					return nil, fmt.Errorf("%s: duplicate key (already given as %q; keys match case-insensitively)", sub, prev)
				}
				folded[strings.ToLower(key)] = key
				v, err := decodeValue(dec, sub, depth+1)
				if err != nil {
					return nil, err
				}
				obj.keys = append(obj.keys, key)
				obj.vals[key] = v
			}
			if _, err := dec.Token(); err != nil {
				return nil, syntaxError(err, dec)
			}
			return &value{path: path, v: obj}, nil
		case '[':
			var arr []*value
			for i := 0; dec.More(); i++ {
				v, err := decodeValue(dec, fmt.Sprintf("%s[%d]", path, i), depth+1)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, syntaxError(err, dec)
			}
			if arr == nil {
				arr = []*value{}
			}
			return &value{path: path, v: arr}, nil
		}
		return nil, fmt.Errorf("unexpected %q at offset %d", t, dec.InputOffset())
	default:
		return &value{path: path, v: tok}, nil
	}
}

func syntaxError(err error, dec *json.Decoder) error {
	if errors.Is(err, io.EOF) {
		return errors.New("invalid JSON: unexpected end of input")
	}
	return &jsonSyntaxError{offset: dec.InputOffset(), err: err}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func (v *value) name() string {
	if v.path == "" {
		return "config"
	}
	return v.path
}

func kindOf(x any) string {
	switch x.(type) {
	case *object:
		return "an object"
	case []*value:
		return "a list"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", x)
}

func (v *value) object() (*object, error) {
	if o, ok := v.v.(*object); ok {
		return o, nil
	}
	return nil, fmt.Errorf("%s: want an object, got %s", v.name(), kindOf(v.v))
}

func (v *value) list() ([]*value, error) {
	if a, ok := v.v.([]*value); ok {
		return a, nil
	}
	return nil, fmt.Errorf("%s: want a list, got %s", v.name(), kindOf(v.v))
}

func (v *value) str() (string, error) {
	if s, ok := v.v.(string); ok {
		return s, nil
	}
	return "", fmt.Errorf("%s: want a string, got %s", v.name(), kindOf(v.v))
}

func (v *value) boolean() (bool, error) {
	if b, ok := v.v.(bool); ok {
		return b, nil
	}
	return false, fmt.Errorf("%s: want true or false, got %s", v.name(), kindOf(v.v))
}

// integer accepts a JSON integer; the SR-IOV operator and hand-written
// configs sometimes quote numbers, so "300" is accepted too.
func (v *value) integer() (int64, error) {
	var n json.Number
	switch x := v.v.(type) {
	case json.Number:
		n = x
	case string:
		n = json.Number(strings.TrimSpace(x))
	default:
		return 0, fmt.Errorf("%s: want an integer, got %s", v.name(), kindOf(v.v))
	}
	i, err := n.Int64()
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not an integer", v.name(), string(n))
	}
	return i, nil
}

// strings returns a list of strings. A single string is accepted as a
// list of one, which the upstream plugins would refuse.
func (v *value) strings() ([]string, error) {
	arr, err := v.list()
	if err != nil {
		if s, ok := v.v.(string); ok {
			return []string{s}, nil
		}
		return nil, fmt.Errorf("%s: want a list of strings, got %s", v.name(), kindOf(v.v))
	}
	out := make([]string, 0, len(arr))
	for _, e := range arr {
		s, err := e.str()
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// fields matches o's keys case-insensitively against known (the keys in
// their canonical spelling) and returns the values by canonical key. A key
// in unsupported (by lower-case spelling) is ignored while its value is
// off (see off): the SR-IOV Network Operator writes "NeedVhostNet": false
// into every selector it renders. Set to anything else it is an error
// with the key's own explanation; any other unknown key is an error that
// lists what is accepted.
func (o *object) fields(path string, known []string, unsupported map[string]unsupportedKey) (map[string]*value, error) {
	byLower := make(map[string]string, len(known))
	for _, k := range known {
		byLower[strings.ToLower(k)] = k
	}
	out := make(map[string]*value, len(o.keys))
	for _, k := range o.keys {
		lk := strings.ToLower(k)
		if canon, ok := byLower[lk]; ok {
			out[canon] = o.vals[k]
			continue
		}
		if u, ok := unsupported[lk]; ok {
			if o.vals[k].off() {
				continue
			}
			return nil, fmt.Errorf("%s: %s (remove the key, or set it to %s)", join(path, k), u.why, u.off)
		}
		sorted := append([]string(nil), known...)
		sort.Strings(sorted)
		return nil, fmt.Errorf("%s: unknown key %q (known keys: %s)", orConfig(path), k, strings.Join(sorted, ", "))
	}
	return out, nil
}

func orConfig(path string) string {
	if path == "" {
		return "config"
	}
	return path
}

// off reports whether v is the zero value of its JSON kind — null, false,
// 0, "", [] or {} — what a Go encoder writes for a field it was never
// given: an option that asks for nothing.
func (v *value) off() bool {
	switch x := v.v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case string:
		return x == ""
	case json.Number:
		f, err := x.Float64()
		return err == nil && f == 0
	case []*value:
		return len(x) == 0
	case *object:
		return len(x.keys) == 0
	}
	return false
}
