package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/relay-dev/relay/edge/rpc"
)

// openIngest opens path for by-path ingestion. The RPC has no
// authentication, so without this any local client could make edged read,
// and relay to its peers, any file edged can read: its own TLS key, its
// database. Hence:
//
//   - nothing is read unless rpc.ingest_dirs lists directories;
//   - path, with every symlink resolved, must lie inside one of them (also
//     resolved), so neither ".." nor a symlink leads out;
//   - the file is opened through an os.Root of that directory, so a
//     symlink swapped in after the check cannot lead out either;
//   - it must be a regular file (a FIFO or device could block or never end).
//
// A path that does not resolve is reported as not found only when its
// directory resolves to an ingest dir or one inside it, so the refusal does not tell a client
// which files exist elsewhere.
func openIngest(dirs []string, path string) (*os.File, error) {
	if len(dirs) == 0 {
		return nil, fmt.Errorf("%w: ingesting by path is disabled because rpc.ingest_dirs is empty; "+
			"upload the file's bytes instead (edgectl segment put without --by-path), or list its directory in rpc.ingest_dirs",
			rpc.ErrForbidden)
	}
	outside := func(real string) error {
		return fmt.Errorf("%w: %s is not a file inside rpc.ingest_dirs (%s)%s",
			rpc.ErrForbidden, path, strings.Join(dirs, ", "), real)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		parent, perr := filepath.EvalSymlinks(filepath.Dir(path))
		for _, d := range dirs {
			rd, derr := filepath.EvalSymlinks(d)
			if _, in := within(rd, parent); perr == nil && derr == nil && (in || parent == rd) {
				return nil, fmt.Errorf("ingest %s: %w", path, err)
			}
		}
		return nil, outside("")
	}
	for _, d := range dirs {
		rd, err := filepath.EvalSymlinks(d)
		if err != nil {
			continue // a missing ingest dir holds nothing
		}
		rel, ok := within(rd, real)
		if !ok {
			continue
		}
		root, err := os.OpenRoot(rd)
		if err != nil {
			return nil, fmt.Errorf("ingest %s: %w", path, err)
		}
		// O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
		// writer, forever; it is refused below as not a regular file.
		f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		root.Close()
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("ingest %s: %w", path, err)
			}
			return nil, fmt.Errorf("%w: ingest %s: %v", rpc.ErrForbidden, path, err)
		}
		fi, err := f.Stat()
		if err == nil && !fi.Mode().IsRegular() {
			err = fmt.Errorf("%w: %s is not a regular file (%s)", rpc.ErrForbidden, path, fi.Mode().Type())
		}
		if err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
	if real != path {
		return nil, outside(" (it resolves to " + real + ")")
	}
	return nil, outside("")
}

// within returns p relative to dir when p lies strictly inside dir. Both
// must be clean absolute paths.
func within(dir, p string) (string, bool) {
	rel, err := filepath.Rel(dir, p)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		return "", false
	}
	return rel, true
}
