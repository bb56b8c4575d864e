package segstore

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/relay-dev/relay/edge/wire"
)

// The digest tag: a copy of what the index says about a segment, kept
// with the file itself so that the index can be rebuilt when the database
// is lost (see Rebuild in the package documentation).
//
// The commit path tags the temp file with the offered digest (and the
// source peer) right after creating it. The file is renamed to its id only
// after its content was verified against that same digest and fsynced,
// and fsync makes the extended attribute durable with the content (it is
// inode metadata). So a file under its id whose content hashes to its tag
// is exactly what was verified and acknowledged; one that does not was
// damaged after the commit. Tagging before any byte is written keeps the
// tag out of the copy and hash, and costs one syscall and no fsync.
//
// Where the file system has no user extended attributes the tag is simply
// missing: writes go on (the index is still the commit point), and a
// rebuild falls back to the content's own digest (RebuiltFromContent).
const (
	tagAttr   = "user.edged.segment"
	maxTagLen = 512
)

type tag struct {
	SHA256 string `json:"sha256"`
	Source string `json:"source,omitempty"`
}

// tagFile sets path's digest tag. Best effort: a file system without
// extended attributes, or any other failure, leaves the file untagged.
func tagFile(path, digest, source string) {
	v, err := json.Marshal(tag{SHA256: digest, Source: source})
	if err != nil || len(v) > maxTagLen {
		return
	}
	_ = setTag(path, v)
}

// errNoTag means the file carries no (readable) digest tag.
var errNoTag = errors.New("no digest tag")

// readTag returns path's digest tag, errNoTag when it has none, or an
// error when it has one that does not decode (a damaged tag is treated
// like damaged content: the file is quarantined).
func readTag(path string) (tag, error) {
	v, err := getTag(path)
	if err != nil {
		return tag{}, fmt.Errorf("%w: %v", errNoTag, err)
	}
	var t tag
	if err := json.Unmarshal(v, &t); err != nil {
		return tag{}, fmt.Errorf("digest tag %q: %w", v, err)
	}
	d, err := normDigest(t.SHA256)
	if err != nil {
		return tag{}, fmt.Errorf("digest tag: %w", err)
	}
	t.SHA256 = d
	if t.Source != "" && wire.CheckNodeID(t.Source) != nil {
		return tag{}, fmt.Errorf("digest tag: source %q is not a node id", t.Source)
	}
	return t, nil
}
