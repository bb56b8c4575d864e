package segstore

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/relay-dev/relay/edge/wire"
)

var indexBucket = []byte("edge.segments")

// MaxIDLen bounds a segment id (it is a file name).
const MaxIDLen = wire.MaxSegmentIDLen

const tmpPrefix = ".tmp-"

// Options are a Store's limits (storage.* in the agent config).
type Options struct {
	QuotaBytes      int64 // > 0: stored + reserved bytes
	QuotaSegments   int64 // > 0: stored + reserved segments
	MaxSegmentBytes int64 // > 0: one segment
	// Now stamps received and relayed times; nil means time.Now.
	Now func() time.Time
	// SyncDir fsyncs a directory; nil means SyncDir. Open calls it for the
	// parent of every directory it creates (tests record the calls).
	SyncDir func(dir string) error
	// VerifyOnOpen makes Open hash every indexed file and quarantine the
	// ones whose content no longer matches the entry's digest (damage after
	// the commit: bit rot, a bad card). It reads the whole store once per
	// start; without it only the sizes are checked.
	VerifyOnOpen bool
	// MakeRoom, when set (storage.on_full: evict_relayed_oldest), is asked
	// to free space when the store is full: by Reserve with the bytes and
	// segments a reservation lacks under the quota, and after a write the
	// disk refused (ENOSPC) with the segment's size. It is called without
	// the Store's lock, may call EvictIf, and returns when it has done what
	// it can; Reserve then tries once more. See room.go.
	MakeRoom func(bytes, segments int64)
	// FsyncEachFile makes every segment file fsynced on its own before its
	// group commits, instead of one syncfs(2) of the file system per
	// group. It is the only way where syncfs is missing or does not report
	// writeback errors (other systems, Linux before 5.8), and the way to
	// choose when the store shares its file system with a heavy writer
	// whose dirty data each syncfs would flush too.
	FsyncEachFile bool
	// WrapTemp, when set, wraps the writer of every temp file's content,
	// and of every pack record's append: tests inject disk failures
	// (ENOSPC after n bytes) around the real file with it. nil in
	// production.
	WrapTemp func(id string, w io.Writer) io.Writer
	// SourceReserveBytes and SourceReserveSegments, when > 0, bound what
	// the reservations of one source (ReserveFrom) may hold at once: a
	// peer whose offers stall cannot take the whole quota from the others
	// (issue 20: 15 stalled 64 MiB offers held 960 MiB of 1 GiB). A
	// reservation beyond them is ErrSourceShare. Reserve, with no source,
	// is bound by the quota alone.
	SourceReserveBytes, SourceReserveSegments int64
	// PackMaxBytes > 0 stores segments of at most this size as records
	// of shared pack files instead of a file each (packs.go), where the
	// file system can punch holes; 0 keeps a file per segment. Segments
	// already in packs stay readable either way.
	PackMaxBytes int64
	// OnQuarantine, when set, hears of every stored copy a Reader found
	// damaged and quarantined (verify.go), after the fact; it must not
	// block. Copies quarantined by Open are in Recovered.
	OnQuarantine func(Quarantined)
	// OnRefetched, when set, hears of every segment committed that the
	// store had lost and wanted back (Wanted), after its commit.
	OnRefetched func(Entry)
	// OnCommit, when set, hears of every segment committed (a receive, a
	// local ingest, a segment fetched back), after its commit; it must not
	// block. edged's relay API reporter takes it as the sign to report
	// soon.
	OnCommit func(Entry)
	// ReceiveMemory bounds the received bytes the store holds in memory
	// between receipt and commit (packed segments, and what Stage reads),
	// and, separately, what receivers take with Hold: budgets for the
	// process, whatever the number of connections. Zero means
	// DefaultReceiveMemory.
	ReceiveMemory int64
}

// Entry is one index entry.
type Entry struct {
	ID        string
	Size      int64
	SHA256    string // 64 lower-case hex digits
	Received  time.Time
	Source    string // peer id the segment came from; "" for local ingest
	Relayed   bool   // the success condition was met (see MarkRelayed)
	RelayedAt time.Time
	// Rebuilt is "" for an entry written by a receive or an ingest, and
	// RebuiltFromTag or RebuiltFromContent for one Open rebuilt from the
	// file after the index was lost.
	Rebuilt string
	// loc is the record of a packed segment; zero for a segment file.
	loc location
}

// Packed reports whether the segment is a record in a pack file rather
// than a file of its own.
func (e Entry) Packed() bool { return e.loc.pack != "" }

type storedEntry struct {
	Size       int64  `json:"size"`
	SHA256     string `json:"sha256"`
	ReceivedNS int64  `json:"received_ns"`
	Source     string `json:"source,omitempty"`
	Relayed    bool   `json:"relayed,omitempty"`
	RelayedNS  int64  `json:"relayed_ns,omitempty"`
	Rebuilt    string `json:"rebuilt,omitempty"`
	Pack       string `json:"pack,omitempty"`
	PackOff    int64  `json:"pack_off,omitempty"`
	PackLen    int64  `json:"pack_len,omitempty"`
}

func (e Entry) encode() ([]byte, error) {
	se := storedEntry{Size: e.Size, SHA256: e.SHA256, ReceivedNS: e.Received.UnixNano(), Source: e.Source, Relayed: e.Relayed, Rebuilt: e.Rebuilt,
		Pack: e.loc.pack, PackOff: e.loc.off, PackLen: e.loc.len}
	if e.Relayed {
		se.RelayedNS = e.RelayedAt.UnixNano()
	}
	return json.Marshal(se)
}

// putEntry writes e as its id's index entry in b.
func putEntry(b *bolt.Bucket, e Entry) error {
	v, err := e.encode()
	if err != nil {
		return err
	}
	return b.Put([]byte(e.ID), v)
}

func decodeEntry(id string, v []byte) (Entry, error) {
	var se storedEntry
	if err := json.Unmarshal(v, &se); err != nil {
		return Entry{}, fmt.Errorf("decode index entry %s: %w", id, err)
	}
	e := Entry{ID: id, Size: se.Size, SHA256: se.SHA256, Received: time.Unix(0, se.ReceivedNS).UTC(), Source: se.Source, Relayed: se.Relayed, Rebuilt: se.Rebuilt,
		loc: location{pack: se.Pack, off: se.PackOff, len: se.PackLen}}
	if se.Relayed {
		e.RelayedAt = time.Unix(0, se.RelayedNS).UTC()
	}
	return e, nil
}

// Usage is the quota state, for status and quota RPCs.
type Usage struct {
	Bytes, Segments                 int64 // stored
	ReservedBytes, ReservedSegments int64 // held by receivers in progress
	QuotaBytes, QuotaSegments       int64
	MaxSegmentBytes                 int64
}

// ScanReport says what Open's start-up scan repaired.
type ScanReport struct {
	RemovedTemp    []string      // leftover temp files removed
	RemovedOrphans []string      // segment files without an index entry, removed
	DroppedEntries []string      // index entries whose file was missing or quarantined, dropped
	Unknown        []string      // files in segments/ that are not segments, left alone
	Quarantined    []Quarantined // damaged files moved to QuarantineDir (their entries dropped)
	// Rebuilt names the entries created from the segment files because the
	// database had no index (see the package documentation); Unverified
	// are those among them whose file carried no digest tag.
	Rebuilt    []string
	Unverified []string
	// Verified counts the files hashed against their index entries
	// (Options.VerifyOnOpen), or against their tags in a rebuild.
	Verified int
}

// step names a point in the commit path, for fault injection in tests.
type step string

const (
	stepCreated  step = "created"  // temp file created, empty
	stepCopied   step = "copied"   // content written and verified, not yet fsynced
	stepSynced   step = "synced"   // temp file fsynced (unless the group syncs the file system) and closed, not renamed
	stepRenamed  step = "renamed"  // renamed into place, directory not fsynced
	stepDirSync  step = "dirsync"  // directory fsynced, index entry not committed
	stepIndexed  step = "indexed"  // index entry committed
	stepUnindex  step = "unindex"  // eviction: index entry removed, file not yet removed
	stepUnlinked step = "unlinked" // eviction: file removed (or record punched), directory not fsynced
	// A packed segment's commit (packs.go) passes stepCopied (verified in
	// memory), stepPacked, stepDirSync (pack durable, index entry not
	// committed) and stepIndexed.
	stepPacked step = "packed" // record appended to the pack, not yet durable
)

// Store is the segment store. See the package documentation.
type Store struct {
	dir  string // <dir>/segments
	db   *bolt.DB
	opt  Options
	scan ScanReport
	// fault, when set (tests only), runs at each step and may fail it.
	fault func(step) error

	mu       sync.Mutex
	bytes    int64
	count    int64
	resBytes int64
	resCount int64
	bySource map[string]reserved // ReserveFrom's reservations per source
	busy     map[string]bool     // ids being written or evicted

	group groupCommitter // see group.go
	// fsSync flushes the store's file system (syncfs); nil when every file
	// is fsynced on its own (Options.FsyncEachFile, or no usable syncfs).
	fsSync func() error
	// writeBehind is how often a receive starts the writeback of what it
	// wrote (writebehind.go): writeBehindWindow; 0 (tests) turns it off.
	writeBehind int64

	// Packs (packs.go). packing: new small segments go into packs. packs
	// and nextPack are guarded by mu; writer belongs to the group commit's
	// leader.
	packing  bool
	packs    map[string]*pack
	nextPack uint64
	writer   *packWriter

	// live are the copies quarantined since Open (a Reader found them
	// damaged); wanted the ids lost and wanted back (verify.go). Both
	// under mu.
	live   []Quarantined
	wanted map[string]bool
	// tombs are the ids taken down (takedown.go), under mu.
	tombs map[string]bool

	// mem and held are the receive memory budgets (Options.ReceiveMemory,
	// budget.go): segments staged in memory, and what Hold hands out.
	mem, held memBudget
}

// Open opens the store under dir (creating dir/segments), creates its
// index bucket in db, and runs the start-up scan (see the package
// documentation). The caller owns db and closes it after the Store's last
// use; the Store has no Close (on Linux it keeps its segments directory
// open for syncfs, released with the Store).
func Open(dir string, db *bolt.DB, opt Options) (*Store, error) {
	if opt.QuotaBytes <= 0 || opt.QuotaSegments <= 0 || opt.MaxSegmentBytes <= 0 {
		return nil, fmt.Errorf("open segment store: quota and max segment size must be > 0: %+v", opt)
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.ReceiveMemory <= 0 {
		opt.ReceiveMemory = DefaultReceiveMemory
	}
	s := &Store{mem: memBudget{size: opt.ReceiveMemory}, held: memBudget{size: opt.ReceiveMemory}, dir: filepath.Join(dir, "segments"), db: db, opt: opt, busy: map[string]bool{},
		bySource: map[string]reserved{}, writeBehind: writeBehindWindow,
		packs: map[string]*pack{}, nextPack: 1}
	for _, d := range []string{s.dir, s.packDir()} {
		if err := CreateDir(d, 0o700, opt.SyncDir); err != nil {
			return nil, fmt.Errorf("open segment store: %w", err)
		}
	}
	if opt.PackMaxBytes > 0 {
		s.packing = probePunch(s.packDir()) == nil
	}
	if !opt.FsyncEachFile {
		s.fsSync = fsSyncer(s.dir)
	}
	s.injectFaults() // faultinject builds only: see faultinject.go
	fresh := false
	if err := db.View(func(tx *bolt.Tx) error {
		fresh = tx.Bucket(indexBucket) == nil
		return nil
	}); err != nil {
		return nil, fmt.Errorf("open segment store: %w", err)
	}
	if err := s.reconcile(fresh); err != nil {
		return nil, fmt.Errorf("open segment store: %w", err)
	}
	if err := s.loadWanted(); err != nil {
		return nil, fmt.Errorf("open segment store: %w", err)
	}
	if err := s.loadTombs(); err != nil {
		return nil, fmt.Errorf("open segment store: %w", err)
	}
	return s, nil
}

// Packing reports whether new small segments go into pack files: asked
// for (Options.PackMaxBytes) and the file system can punch holes.
func (s *Store) Packing() bool { return s.packing }

// Recovered returns what the start-up scan repaired.
func (s *Store) Recovered() ScanReport { return s.scan }

// reconcile is the start-up scan. It runs before the Store is shared.
// With fresh (the database has no index bucket yet) the index is rebuilt
// from the files instead of taking them for orphans.
func (s *Store) reconcile(fresh bool) error {
	des, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	files := map[string]int64{}
	for _, de := range des {
		name := de.Name()
		switch {
		case strings.HasPrefix(name, tmpPrefix):
			if err := os.Remove(filepath.Join(s.dir, name)); err != nil {
				return fmt.Errorf("remove temp file: %w", err)
			}
			s.scan.RemovedTemp = append(s.scan.RemovedTemp, name)
		case de.Type().IsRegular() && ValidID(name) == nil:
			fi, err := de.Info()
			if err != nil {
				return err
			}
			files[name] = fi.Size()
		default:
			s.scan.Unknown = append(s.scan.Unknown, name)
		}
	}
	packs, err := s.listPacks()
	if err != nil {
		return err
	}
	if fresh {
		if err := s.rebuild(files, packs); err != nil {
			return err
		}
		if len(s.scan.RemovedTemp) > 0 {
			return syncDir(s.dir)
		}
		return nil
	}
	var entries []Entry
	err = s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(indexBucket).ForEach(func(k, v []byte) error {
			e, err := decodeEntry(string(k), v)
			entries = append(entries, e)
			return err
		})
	})
	if err != nil {
		return err
	}
	// Sized up front: with 10,000 entries (about 2 MB) each slice grown
	// by appending allocated twice its size, all live at once with
	// entries, in the heap peak of the start.
	nPacked := 0
	for _, e := range entries {
		if e.Packed() {
			nPacked++
		}
	}
	fileEntries, packed := make([]Entry, 0, len(entries)-nPacked), make([]Entry, 0, nPacked)
	for _, e := range entries {
		if e.Packed() {
			packed = append(packed, e)
		} else {
			fileEntries = append(fileEntries, e)
		}
	}
	drop, err := s.checkFiles(fileEntries, files)
	if err != nil {
		return err
	}
	dropPacked, err := s.checkPacked(packed, packs)
	if err != nil {
		return err
	}
	drop = append(drop, dropPacked...)
	dropped := map[string]bool{}
	for _, id := range drop {
		dropped[id] = true
	}
	if len(drop) > 0 {
		// Each was acknowledged once and is lost now: it is wanted back
		// (verify.go), in the transaction that drops it.
		now := s.opt.Now()
		err = s.db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(indexBucket)
			for _, id := range drop {
				if err := b.Delete([]byte(id)); err != nil {
					return err
				}
			}
			return wantDropped(tx, entries, dropped, now)
		})
		if err != nil {
			return err
		}
	}
	s.scan.DroppedEntries = drop
	var bytes, count int64
	livePacked := make([]Entry, 0, len(packed))
	for _, e := range entries {
		if e.Packed() {
			// A file under a packed segment's id is an orphan.
			if !dropped[e.ID] {
				livePacked = append(livePacked, e)
				bytes += e.Size
				count++
			}
			continue
		}
		if _, ok := files[e.ID]; ok && !dropped[e.ID] {
			bytes += e.Size
			count++
		}
		delete(files, e.ID)
	}
	if err := s.setupPacks(livePacked, packs); err != nil {
		return err
	}
	for id := range files {
		if err := os.Remove(filepath.Join(s.dir, id)); err != nil {
			return fmt.Errorf("remove orphan segment file: %w", err)
		}
		s.scan.RemovedOrphans = append(s.scan.RemovedOrphans, id)
	}
	if len(s.scan.RemovedTemp)+len(s.scan.RemovedOrphans) > 0 {
		if err := syncDir(s.dir); err != nil {
			return err
		}
	}
	s.bytes, s.count = bytes, count
	return nil
}

// ValidID reports whether id can name a segment (wrapping ErrInvalid).
// The rule is the wire's (wire.CheckSegmentID): a segment stored under an
// id that OFFER cannot carry could never be relayed.
func ValidID(id string) error {
	if err := wire.CheckSegmentID(id); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

func normDigest(d string) (string, error) {
	b, err := hex.DecodeString(d)
	if err != nil || len(b) != 32 {
		return "", fmt.Errorf("%w: sha256 %q is not 64 hex digits", ErrInvalid, d)
	}
	return hex.EncodeToString(b), nil
}

// Stat returns the index entry for id, or ErrNotFound.
func (s *Store) Stat(id string) (Entry, error) {
	var e Entry
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(indexBucket).Get([]byte(id))
		if v == nil {
			return fmt.Errorf("stat %s: %w", id, ErrNotFound)
		}
		var err error
		e, err = decodeEntry(id, v)
		return err
	})
	return e, err
}

// HeldIn reports whether id has an index entry, as seen by tx (a
// transaction on the Store's database): for checks that must see the
// index in their own transaction, such as ledger.RemoveSettled. It does
// not take the Store's lock, so it is safe inside any transaction.
func (s *Store) HeldIn(tx *bolt.Tx, id string) bool {
	b := tx.Bucket(indexBucket)
	return b != nil && b.Get([]byte(id)) != nil
}

// Held reports which of ids have an index entry (held[i] for ids[i]), in
// one read transaction: start-up asks it, a page at a time, for every
// segment with work pending (ledger.Held), where a Stat each cost a read
// transaction each.
func (s *Store) Held(ids []string) ([]bool, error) {
	held := make([]bool, len(ids))
	err := s.db.View(func(tx *bolt.Tx) error {
		for i, id := range ids {
			held[i] = s.HeldIn(tx, id)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("held: %w", err)
	}
	return held, nil
}

// List returns every index entry in id order.
func (s *Store) List() ([]Entry, error) {
	var out []Entry
	err := s.Each(func(e Entry) error {
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list segments: %w", err)
	}
	return out, nil
}

// Each calls fn with every index entry in id order, one at a time, so
// that a caller that only counts or filters holds one entry, not the
// whole index. It runs in one read transaction of the database: fn must
// not write to it (a write waiting on a read transaction held by its own
// goroutine can deadlock), and an error from fn stops the walk.
func (s *Store) Each(fn func(Entry) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(indexBucket).ForEach(func(k, v []byte) error {
			e, err := decodeEntry(string(k), v)
			if err != nil {
				return err
			}
			return fn(e)
		})
	})
}

// Open opens a stored segment for reading. It stays readable after a
// concurrent eviction (a file by POSIX unlink semantics, a pack record
// because its punch waits for the reader); the caller closes it. Reading
// it verifies it: a copy whose content no longer matches its entry is
// ErrDamaged at the end of the read, and quarantined (verify.go).
func (s *Store) Open(id string) (*Reader, Entry, error) {
	s.mu.Lock()
	e, err := s.Stat(id) // under mu: see openPackedLocked
	if err == nil && e.Packed() {
		var r *Reader
		r, err = s.openPackedLocked(e)
		s.mu.Unlock()
		return r, e, err
	}
	s.mu.Unlock()
	if err != nil {
		return nil, Entry{}, err
	}
	f, err := os.Open(filepath.Join(s.dir, id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, Entry{}, fmt.Errorf("open segment %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, Entry{}, fmt.Errorf("open segment %s: %w", id, err)
	}
	// The whole file, not e.Size bytes of it: a file that grew is damage
	// Verify must see.
	return &Reader{SectionReader: io.NewSectionReader(f, 0, math.MaxInt64), f: f, v: newVerifier(s, e)}, e, nil
}

// Where returns the file that holds a stored segment's content and the
// content's offset in it: segments/<id> and 0, or a pack and the offset
// of the record's content. For operators inspecting a store, and tests
// that damage one.
func (s *Store) Where(id string) (path string, off int64, err error) {
	e, err := s.Stat(id)
	if err != nil {
		return "", 0, err
	}
	if !e.Packed() {
		return filepath.Join(s.dir, id), 0, nil
	}
	return filepath.Join(s.packDir(), e.loc.pack), e.loc.off + recordHeaderLen(e.ID, e.Source), nil
}

// MarkRelayed sets the entry's relayed marker (and RelayedAt, the first
// time). Idempotent; ErrNotFound if the segment is not stored. marked is
// true only for the call that set it, so concurrent callers can tell
// which one reports the success.
func (s *Store) MarkRelayed(id string) (e Entry, marked bool, err error) {
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(indexBucket)
		v := b.Get([]byte(id))
		if v == nil {
			return ErrNotFound
		}
		var err error
		if e, err = decodeEntry(id, v); err != nil || e.Relayed {
			return err
		}
		e.Relayed, e.RelayedAt = true, s.opt.Now().UTC()
		marked = true
		return putEntry(b, e)
	})
	if err != nil {
		return Entry{}, false, fmt.Errorf("mark relayed %s: %w", id, err)
	}
	return e, marked, nil
}

// ClearRelayed removes the entry's relayed marker: the success condition
// no longer holds because the segment's required peers grew (a peer was
// added to known_peers). The marker says the condition is met, so one
// left standing would contradict the ledger. Idempotent; ErrNotFound if
// the segment is not stored; cleared is true only if a marker was removed.
func (s *Store) ClearRelayed(id string) (cleared bool, err error) {
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(indexBucket)
		v := b.Get([]byte(id))
		if v == nil {
			return ErrNotFound
		}
		e, err := decodeEntry(id, v)
		if err != nil || !e.Relayed {
			return err
		}
		e.Relayed, e.RelayedAt = false, time.Time{}
		cleared = true
		return putEntry(b, e)
	})
	if err != nil {
		return false, fmt.Errorf("clear relayed %s: %w", id, err)
	}
	return cleared, nil
}

// Usage returns the current quota state.
func (s *Store) Usage() Usage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Usage{
		Bytes: s.bytes, Segments: s.count, ReservedBytes: s.resBytes, ReservedSegments: s.resCount,
		QuotaBytes: s.opt.QuotaBytes, QuotaSegments: s.opt.QuotaSegments, MaxSegmentBytes: s.opt.MaxSegmentBytes,
	}
}

// AllowSegment reports whether a new segment of size bytes would be
// admitted now: ErrInvalid (negative), ErrTooLarge, ErrQuota, or nil. It
// holds nothing; a receiver uses Reserve.
func (s *Store) AllowSegment(size int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.allowLocked(size)
}

func (s *Store) allowLocked(size int64) error {
	switch {
	case size < 0:
		return fmt.Errorf("%w: size %d", ErrInvalid, size)
	case size > s.opt.MaxSegmentBytes:
		return fmt.Errorf("%w: %d > %d bytes", ErrTooLarge, size, s.opt.MaxSegmentBytes)
	case s.bytes+s.resBytes+size > s.opt.QuotaBytes:
		return fmt.Errorf("%w: %d stored + %d reserved + %d > %d bytes", ErrQuota, s.bytes, s.resBytes, size, s.opt.QuotaBytes)
	case s.count+s.resCount+1 > s.opt.QuotaSegments:
		return fmt.Errorf("%w: %d stored + %d reserved segments, limit %d", ErrQuota, s.count, s.resCount, s.opt.QuotaSegments)
	}
	return nil
}

// CreateDir is os.MkdirAll that makes the new directories durable: it
// fsyncs the parent of every directory it creates (with sync, nil meaning
// SyncDir), oldest first. Without that, a crash soon after start-up could
// lose the entry of segments/ or of storage.dir itself, and with it every
// segment acknowledged since. Existing directories are left alone.
func CreateDir(dir string, perm os.FileMode, sync func(dir string) error) error {
	if sync == nil {
		sync = SyncDir
	}
	var missing []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		_, err := os.Stat(d)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("create %s: %w", dir, err)
		}
		missing = append(missing, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		d := missing[i]
		if err := os.Mkdir(d, perm); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create %s: %w", dir, err)
		}
		if err := sync(filepath.Dir(d)); err != nil {
			return fmt.Errorf("create %s: fsync %s: %w", dir, filepath.Dir(d), err)
		}
	}
	return nil
}

// SyncDir fsyncs a directory, making the creation, rename or removal of
// its entries durable.
func SyncDir(dir string) error { return syncDir(dir) }

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

func (s *Store) hit(st step) error {
	if s.fault == nil {
		return nil
	}
	return s.fault(st)
}
