package postgres

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relay-dev/relay/relaycore"
)

// Type OIDs of the statements' parameters (pg_type; fixed for built-in
// types).
const (
	oidBool       = 16
	oidBytea      = 17
	oidInt8       = 20
	oidText       = 25
	oidBoolArray  = 1000
	oidByteaArray = 1001
	oidInt8Array  = 1016
)

// The parameter types the server infers for lockSQL and applySQL (their
// casts and the columns they compare with), in order: what params encodes.
var (
	lockParamOIDs  = []uint32{oidInt8Array}
	applyParamOIDs = []uint32{oidText, oidBytea, oidByteaArray, oidByteaArray, oidBoolArray, oidByteaArray, oidInt8Array, oidByteaArray, oidByteaArray}
	// The reads' (store.go).
	getParamOIDs       = []uint32{oidText, oidBytea, oidBytea}
	getManyParamOIDs   = []uint32{oidText, oidBytea, oidByteaArray}
	scanParamOIDs      = []uint32{oidText, oidBytea, oidBytea, oidBytea, oidInt8}
	scanRangeParamOIDs = []uint32{oidText, oidBytea, oidBytea, oidBytea, oidInt8, oidBytea}
)

// binaryFormat is the protocol's format codes for "every parameter (or
// result column) binary": one code applies to all.
var binaryFormat = []int16{pgtype.BinaryFormatCode}

// checkParamOIDs refuses a prepared statement whose parameter types are not
// want: the encoding would not be what the server decodes.
func checkParamOIDs(sd *pgconn.StatementDescription, want []uint32) error {
	if !slices.Equal(sd.ParamOIDs, want) {
		return fmt.Errorf("postgres: statement parameters of types %v, encoded as %v", sd.ParamOIDs, want)
	}
	return nil
}

// params are one call's statement parameters in the protocol's binary
// formats, all in one buffer, which the pool keeps for the next call (but
// not when a big batch grew it past maxPooledParams).
type params struct {
	buf   []byte
	lock  [1][]byte // lockSQL's
	apply [9][]byte // applySQL's
	read  [6][]byte // a read's
	keys  []int64   // the lock keys
}

const maxPooledParams = 1 << 20

var paramsPool = sync.Pool{New: func() any { return new(params) }}

func getParams() *params { return paramsPool.Get().(*params) }

// release returns e to the pool; nothing may use its parameters after.
func (e *params) release() {
	if cap(e.buf) > maxPooledParams {
		return
	}
	e.lock = [1][]byte{}
	e.apply = [9][]byte{}
	e.read = [6][]byte{}
	paramsPool.Put(e)
}

// encodeRead encodes getSQL's parameters, or the first three of another
// read's, and returns them.
func (e *params) encodeRead(store string, p relaycore.Partition, key string) [][]byte {
	buf := append(e.buf[:0], store...)
	a := len(buf)
	buf = append(buf, p...)
	b := len(buf)
	buf = append(buf, key...)
	e.buf = buf
	e.read[0], e.read[1], e.read[2] = buf[:a:a], buf[a:b:b], buf[b:len(buf):len(buf)]
	return e.read[:3]
}

// encodeGetMany encodes getManySQL's parameters for keys.
func (e *params) encodeGetMany(store string, p relaycore.Partition, keys []string) [][]byte {
	buf := append(e.buf[:0], store...)
	a := len(buf)
	buf = append(buf, p...)
	b := len(buf)
	buf = appendArrayHeader(buf, oidBytea, len(keys))
	for _, k := range keys {
		buf = appendElem(buf, k)
	}
	e.buf = buf
	e.read[0], e.read[1], e.read[2] = buf[:a:a], buf[a:b:b], buf[b:len(buf):len(buf)]
	return e.read[:3]
}

// encodeScan encodes scanSQL's parameters for req and limit, and
// scanRangeSQL's when req has an End.
func (e *params) encodeScan(store string, p relaycore.Partition, req relaycore.ScanRequest, limit int64) [][]byte {
	var ends [6]int
	buf := append(e.buf[:0], store...)
	ends[0] = len(buf)
	buf = append(buf, p...)
	ends[1] = len(buf)
	buf = append(buf, req.Start...)
	ends[2] = len(buf)
	buf = append(buf, req.After...)
	ends[3] = len(buf)
	buf = binary.BigEndian.AppendUint64(buf, uint64(limit))
	ends[4] = len(buf)
	n := 5
	if req.End != "" {
		buf = append(buf, req.End...)
		ends[5] = len(buf)
		n = 6
	}
	e.buf = buf
	start := 0
	for i := range n {
		e.read[i] = buf[start:ends[i]:ends[i]]
		start = ends[i]
	}
	return e.read[:n]
}

// encodeApply encodes lockSQL's and applySQL's parameters for b (see
// applySQL for their order). Values are never NULL: a nil value is sent
// empty (the column is NOT NULL, and a NULL precondition value would
// compare as unknown), and so is an absent precondition's value.
func (e *params) encodeApply(store string, p relaycore.Partition, b relaycore.Batch) {
	buf := e.buf[:0]
	var ends [len(e.apply) + 1]int
	n := 0
	end := func() {
		ends[n] = len(buf)
		n++
	}
	buf = append(buf, store...)
	end()
	buf = append(buf, p...)
	end()
	buf = appendArrayHeader(buf, oidBytea, len(b.Preconditions))
	for _, pc := range b.Preconditions {
		buf = appendElem(buf, pc.Key)
	}
	end()
	buf = appendArrayHeader(buf, oidBytea, len(b.Preconditions))
	for _, pc := range b.Preconditions {
		if pc.Absent {
			buf = appendElem(buf, "")
		} else {
			buf = appendElem(buf, pc.Value)
		}
	}
	end()
	buf = appendArrayHeader(buf, oidBool, len(b.Preconditions))
	for _, pc := range b.Preconditions {
		var a byte
		if pc.Absent {
			a = 1
		}
		buf = append(binary.BigEndian.AppendUint32(buf, 1), a)
	}
	end()
	puts := 0
	for _, w := range b.Writes {
		if !w.Delete {
			puts++
		}
	}
	buf = appendArrayHeader(buf, oidBytea, puts)
	for _, w := range b.Writes {
		if !w.Delete {
			buf = appendElem(buf, w.Key)
		}
	}
	end()
	buf = appendArrayHeader(buf, oidInt8, puts)
	for _, w := range b.Writes {
		if !w.Delete {
			buf = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(buf, 8), uint64(w.Due))
		}
	}
	end()
	buf = appendArrayHeader(buf, oidBytea, puts)
	for _, w := range b.Writes {
		if !w.Delete {
			buf = appendElem(buf, w.Value)
		}
	}
	end()
	buf = appendArrayHeader(buf, oidBytea, len(b.Writes)-puts)
	for _, w := range b.Writes {
		if w.Delete {
			buf = appendElem(buf, w.Key)
		}
	}
	end()
	e.keys = appendLockKeys(e.keys[:0], store, p, b)
	buf = appendArrayHeader(buf, oidInt8, len(e.keys))
	for _, k := range e.keys {
		buf = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(buf, 8), uint64(k))
	}
	end()
	// Sliced only now: appending may have moved the buffer. Full slice
	// expressions, so no parameter can grow into the next.
	start := 0
	for i := range e.apply {
		e.apply[i] = buf[start:ends[i]:ends[i]]
		start = ends[i]
	}
	e.lock[0] = buf[start:ends[len(e.apply)]:ends[len(e.apply)]]
	e.buf = buf
}

// appendArrayHeader appends the binary array format's header (array_recv)
// for a one-dimensional array of n elements of type elem, none NULL, whose
// elements the caller appends next: an empty array has no dimensions.
func appendArrayHeader(buf []byte, elem uint32, n int) []byte {
	if n == 0 {
		buf = binary.BigEndian.AppendUint32(buf, 0) // dimensions
		buf = binary.BigEndian.AppendUint32(buf, 0) // flags: no NULLs
		return binary.BigEndian.AppendUint32(buf, elem)
	}
	buf = binary.BigEndian.AppendUint32(buf, 1)
	buf = binary.BigEndian.AppendUint32(buf, 0)
	buf = binary.BigEndian.AppendUint32(buf, elem)
	buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	return binary.BigEndian.AppendUint32(buf, 1) // lower bound
}

// appendElem appends one bytea (or text) array element: its length, then
// its bytes. nil is sent empty, not NULL.
func appendElem[T string | []byte](buf []byte, v T) []byte {
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(v)))
	return append(buf, v...)
}
