package wire

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// This file is protocol version 2 (docs/wire.md, "Version 2"): the
// receiver's side (RecvRequest, SendAccept, RecvPayload, and SendAck /
// SendNack as final replies) and the sender's (DeliverWindow).

// Request is what a version 2 receiver reads next: an OFFER, or the
// SEGMENT frame of the oldest accepted offer (Segment true; its payload
// is read with RecvPayload before the next RecvRequest), or a PUSH and
// its SEGMENT (Segment and Pushed true).
type Request struct {
	Offer   Offer
	Segment bool
	// Pushed: the segment came in a PUSH, unasked. The receiver has not
	// checked the store for it yet and must read its payload whatever it
	// answers: ACK (stored, or already held), or NACK.
	Pushed bool
	// Query, when not nil, is a QUERY: answer it with SendHolds before
	// the next RecvRequest.
	Query []Offer
	// Want, when not nil, is a WANT (version 3): the peer lost these
	// segments and asks for them again. Answer it with SendHolds, naming
	// those this side holds and will send, before the next RecvRequest.
	Want []Offer
}

// RecvRequest reads the next frame on a version 2 connection. For an
// OFFER or a PUSH it checks the window (ErrWindow) and that the segment id is not
// already in flight (ErrUnexpectedFrame); both leave the stream out of
// step, since the peer no longer follows the protocol. An undecodable
// OFFER is ErrBadMessage with the stream in step: answer NACK bad_request
// and close. A SEGMENT frame belongs to the oldest accepted offer whose
// SEGMENT has not come yet; its length must equal that offer's size. A
// PUSH is returned with the header of its SEGMENT read (Pushed): the next
// frame must be that SEGMENT, of the pushed size, and a PUSH above
// MaxPushSize, undecodable or followed by anything else leaves the stream
// out of step.
// When the peer closed cleanly between frames the error matches io.EOF.
func (c *Conn) RecvRequest(ctx context.Context) (Request, error) {
	var req Request
	err := c.recv(ctx, "recv request", func(r io.Reader) (bool, error) {
		if c.opt.Version < Version2 {
			return false, fmt.Errorf("%w: RecvRequest on a version %d connection", ErrUnexpectedFrame, c.opt.Version)
		}
		if c.payload != nil && c.payload.left > 0 {
			return false, errors.New("previous SEGMENT payload not read")
		}
		c.payload = nil
		h, err := ReadHeader(r)
		if err != nil {
			return false, err
		}
		switch h.Type {
		case TypeOffer:
			o, inStep, err := c.readOffer(r, h)
			req.Offer = o
			return inStep, err
		case TypePush:
			o, _, err := c.readOffer(r, h)
			if err != nil {
				return false, err // the SEGMENT that follows cannot be trusted
			}
			// Its SEGMENT comes next, ahead of any accepted offer's. The
			// receiver's segment size limit is not checked here: a push
			// is small, and a refused one is read and NACKed too_large.
			sh, err := readSegmentHeaderOf(r, o)
			if err != nil {
				return false, fmt.Errorf("after PUSH %s: %w", o.SegmentID, err)
			}
			c.payload = &payloadReader{r: r, left: int64(sh.Length)}
			req = Request{Offer: o, Segment: true, Pushed: true}
			return true, nil
		case TypeQuery, TypeWant:
			if h.Type == TypeWant && c.opt.Version < Version3 {
				return false, fmt.Errorf("%w: WANT on a version %d connection", ErrUnexpectedFrame, c.opt.Version)
			}
			if h.Length > MaxQueryPayload {
				return false, fmt.Errorf("read %s frame: %w: %d bytes, limit %d", h.Type, ErrFrameTooLarge, h.Length, MaxQueryPayload)
			}
			c.mu.Lock()
			open := len(c.open)
			c.mu.Unlock()
			if open > 0 {
				return false, fmt.Errorf("%w: %s with %d offers unanswered", ErrUnexpectedFrame, h.Type, open)
			}
			c.releaseQuery() // a QUERY answered without SendHolds
			if c.opt.Hold != nil {
				release, err := c.opt.Hold(ctx, QueryMemory(int(h.Length)))
				if err != nil {
					return false, fmt.Errorf("read QUERY frame: memory: %w", err)
				}
				c.mu.Lock()
				c.release = release
				c.mu.Unlock()
			}
			p := make([]byte, h.Length)
			if _, err := io.ReadFull(r, p); err != nil {
				c.releaseQuery()
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF
				}
				return false, fmt.Errorf("read %s frame payload: %w", h.Type, err)
			}
			list, err := DecodeSegments(p)
			if err != nil {
				c.releaseQuery()
				return true, err
			}
			if list == nil {
				list = []Offer{}
			}
			if h.Type == TypeWant {
				req.Want = list
			} else {
				req.Query = list
			}
			return true, nil
		case TypeSegment:
			c.mu.Lock()
			if len(c.accepted) == 0 {
				c.mu.Unlock()
				return false, fmt.Errorf("%w: SEGMENT without an accepted offer", ErrUnexpectedFrame)
			}
			o := c.accepted[0]
			c.accepted = c.accepted[1:]
			c.mu.Unlock()
			if int64(h.Length) != o.Size {
				return false, fmt.Errorf("%w: frame of %d bytes, offer %s of %d", ErrSizeMismatch, h.Length, o.SegmentID, o.Size)
			}
			c.payload = &payloadReader{r: r, left: int64(h.Length)}
			req = Request{Offer: o, Segment: true}
			return true, nil
		}
		return false, fmt.Errorf("%w: got %s, want OFFER or SEGMENT", ErrUnexpectedFrame, h.Type)
	})
	return req, err
}

// readOffer reads the payload of an OFFER or PUSH frame whose header h
// was read, and opens the offer in the window. An undecodable payload is
// ErrBadMessage with the frame consumed (inStep); an offer beyond the
// window, for an id already unanswered, or a PUSH above MaxPushSize
// leaves the stream out of step.
func (c *Conn) readOffer(r io.Reader, h Header) (o Offer, inStep bool, err error) {
	if h.Length > MaxControlPayload {
		return o, false, fmt.Errorf("read %s frame: %w: %d bytes, limit %d", h.Type, ErrFrameTooLarge, h.Length, MaxControlPayload)
	}
	p := make([]byte, h.Length)
	if _, err := io.ReadFull(r, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return o, false, fmt.Errorf("read %s frame payload: %w", h.Type, err)
	}
	if o, err = DecodeOffer(p); err != nil {
		return o, true, err
	}
	if h.Type == TypePush && o.Size > MaxPushSize {
		return o, false, fmt.Errorf("%w: PUSH of %s with %d bytes, limit %d", ErrFrameTooLarge, o.SegmentID, o.Size, MaxPushSize)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[o.SegmentID] {
		return o, false, fmt.Errorf("%w: %s for %s, which is already in flight", ErrUnexpectedFrame, h.Type, o.SegmentID)
	}
	if len(c.open) >= c.opt.Window {
		return o, false, fmt.Errorf("%w: %s for %s with %d unanswered, window %d", ErrWindow, h.Type, o.SegmentID, len(c.open), c.opt.Window)
	}
	c.open[o.SegmentID] = true
	return o, true, nil
}

// RecvPayload hands the payload of the SEGMENT frame RecvRequest just
// returned to consume, which must read it to the end (io.EOF) or fail.
// The digest is not checked here: consume does it (the segment store
// hashes while it writes, so hashing twice would only cost CPU). When
// consume fails before the payload's end, the read side is out of step.
func (c *Conn) RecvPayload(ctx context.Context, o Offer, consume func(io.Reader) error) error {
	return c.recv(ctx, "recv segment "+o.SegmentID, func(r io.Reader) (bool, error) {
		p := c.payload
		if p == nil {
			return false, fmt.Errorf("%w: no SEGMENT frame is being read", ErrUnexpectedFrame)
		}
		p.r = r // this operation's reader (deadline arming)
		err := consume(p)
		if p.left > 0 {
			if err == nil {
				err = fmt.Errorf("segment %s: %d payload bytes left unread", o.SegmentID, p.left)
			}
			return false, err
		}
		c.payload = nil
		return true, err
	})
}

// SendAccept tells the peer to send the SEGMENT of an offer received by
// RecvRequest. The receiver then owes it a final ACK or NACK after the
// SEGMENT.
func (c *Conn) SendAccept(ctx context.Context, o Offer) error {
	c.mu.Lock()
	if !c.open[o.SegmentID] {
		c.mu.Unlock()
		return fmt.Errorf("send accept %s: no such offer in flight", o.SegmentID)
	}
	c.accepted = append(c.accepted, o)
	c.mu.Unlock()
	return c.sendControl(ctx, "send accept "+o.SegmentID, TypeAccept, []byte(o.SegmentID), badMessage(CheckSegmentID(o.SegmentID)))
}

// SendHolds answers a QUERY: the queried segments this side durably holds
// with exactly the queried size and digest (a durable claim, as an ACK).
// The memory Options.Hold granted for the QUERY is given back once the
// frame went out (or failed to).
func (c *Conn) SendHolds(ctx context.Context, held []Offer) error {
	defer c.releaseQuery()
	p, err := EncodeSegments(held)
	return c.sendControl(ctx, "send holds", TypeHolds, p, err)
}

// Query asks the peer which of list it already holds, before offering
// any of them; no offer may be unanswered on the connection (call it
// between DeliverStream calls). It returns the entries of list the peer
// names in its HOLDS with exactly the same id, size and digest: the
// peer's durable claim. An entry named with another size or digest is
// not held (it is left out, and counted in mismatched); naming a segment
// that was not queried is ErrAckMismatch.
func (c *Conn) Query(ctx context.Context, list []Offer) (held []Offer, mismatched int, err error) {
	if c.opt.Version < Version2 {
		return nil, 0, fmt.Errorf("query: %w: version %d connection", ErrVersion, c.opt.Version)
	}
	return c.ask(ctx, TypeQuery, list)
}

// Want asks the peer to send list again: this side acknowledged these
// segments once and lost them (found them damaged). No offer may be
// unanswered on the connection. It returns the entries the peer's HOLDS
// names with exactly the same id, size and digest: those it holds and
// has scheduled to send back, as ordinary offers on its own connections.
// An entry named with another size or digest is left out and counted in
// mismatched; naming a segment that was not wanted is ErrAckMismatch.
// Version 3 only (ErrVersion).
func (c *Conn) Want(ctx context.Context, list []Offer) (granted []Offer, mismatched int, err error) {
	if c.opt.Version < Version3 {
		return nil, 0, fmt.Errorf("want: %w: version %d connection", ErrVersion, c.opt.Version)
	}
	return c.ask(ctx, TypeWant, list)
}

// ask sends a QUERY or WANT and matches the HOLDS that answers it.
func (c *Conn) ask(ctx context.Context, t Type, list []Offer) (held []Offer, mismatched int, err error) {
	p, err := EncodeSegments(list)
	if err := c.sendControl(ctx, "send "+strings.ToLower(t.String()), t, p, err); err != nil {
		return nil, 0, err
	}
	var reply []Offer
	err = c.recv(ctx, "recv holds", func(r io.Reader) (bool, error) {
		f, err := ReadFrame(r, MaxQueryPayload)
		if err != nil {
			return false, err
		}
		if f.Type != TypeHolds {
			return false, fmt.Errorf("%w: got %s, want HOLDS", ErrUnexpectedFrame, f.Type)
		}
		reply, err = DecodeSegments(f.Payload)
		return true, err
	})
	if err != nil {
		return nil, 0, err
	}
	queried := make(map[string]Offer, len(list))
	for _, o := range list {
		queried[o.SegmentID] = o
	}
	for _, o := range reply {
		q, ok := queried[o.SegmentID]
		switch {
		case !ok:
			return nil, 0, fmt.Errorf("%w: HOLDS names %q, which was not asked for", ErrAckMismatch, o.SegmentID)
		case q != o:
			mismatched++
		default:
			held = append(held, o)
		}
	}
	return held, mismatched, nil
}

// answered frees the window slot of segmentID (version 2) once its final
// reply is being sent.
func (c *Conn) answered(segmentID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.open, segmentID)
}

// Item is one segment for DeliverWindow. Open is called when the peer
// accepts the offer, so a window of offers does not hold a window of open
// files; it must yield exactly Offer.Size bytes. Closing is DeliverWindow's.
type Item struct {
	Offer Offer
	Open  func() (io.ReadCloser, error)
	// Push sends a segment of at most MaxPushSize bytes in a PUSH with
	// its SEGMENT right behind, without waiting for an ACCEPT: one round
	// trip less per segment, at the price of sending the bytes of one the
	// peer may already hold. Larger segments are offered whatever Push
	// says.
	Push bool
}

// Result is one item's outcome. Err nil means the peer acknowledged the
// segment: it stored it durably (Sent) or already held it and declined it
// before any byte was sent (Sent false). Replied tells a failure the peer
// answered (a NACK) from one where the connection failed first.
type Result struct {
	Err     error
	Sent    bool
	Replied bool
}

// Item states in DeliverStream.
const (
	itemOffered  = iota // OFFER sent, no reply yet
	itemAccepted        // ACCEPT received, SEGMENT not started
	itemSending         // SEGMENT being written or written
	itemDone            // final reply (or failure) recorded
)

// DeliverWindow delivers items over a version 2 connection with up to
// PeerWindow offers in flight (DeliverStream), and returns one result per
// item, in order. Item ids must be distinct.
func (c *Conn) DeliverWindow(ctx context.Context, items []Item, replyTimeout time.Duration) []Result {
	res := make([]Result, len(items))
	index := make(map[string]int, len(items))
	k := 0
	var mu sync.Mutex // index is written by next and read by done
	next := func() (Item, bool) {
		if k == len(items) {
			return Item{}, false
		}
		k++
		mu.Lock()
		index[items[k-1].Offer.SegmentID] = k - 1
		mu.Unlock()
		return items[k-1], true
	}
	done := func(it Item, r Result) {
		mu.Lock()
		defer mu.Unlock()
		res[index[it.Offer.SegmentID]] = r
	}
	if err := c.DeliverStream(ctx, next, done, replyTimeout); err != nil {
		for i := k; i < len(items); i++ {
			res[i].Err = err // never offered
		}
	}
	return res
}

// DeliverStream delivers the items next yields over a version 2
// connection, keeping up to PeerWindow offers unanswered: whenever a slot
// is free it asks next for another item, until next reports none (then it
// finishes the items in flight and returns). done is called once per item
// yielded, with its result, as soon as it is known: on the item's final
// reply, or when the connection fails. next runs on the writing goroutine
// and done on the reading one; neither may block for long.
//
// Replies are matched by segment id, in any order. An ACK is success only
// for an offered or sent segment; an ACCEPT, ACK or NACK naming anything
// else, or an ACK for an accepted segment not yet sent, is the peer
// breaking the protocol (ErrAckMismatch): every unfinished item fails.
//
// replyTimeout bounds the wait for the next reply while nothing is being
// written (zero: no bound besides ctx): a peer that stops answering fails
// the unfinished items and the connection is closed. The error returned
// is the connection failure, if any: the caller must then close the Conn.
// Ids of items in flight together must be distinct.
func (c *Conn) DeliverStream(ctx context.Context, next func() (Item, bool), done func(Item, Result), replyTimeout time.Duration) error {
	if c.opt.Version < Version2 {
		return fmt.Errorf("deliver: %w: version %d connection", ErrVersion, c.opt.Version)
	}
	window := c.PeerWindow()
	p := &pipeline{c: c, next: next, done: done, items: map[string]*pending{},
		accepted: make(chan *pending, window), freed: make(chan struct{}, window)}
	p.wake = sync.NewCond(&p.mu)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.cancel = cancel
	stopWake := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.wake.Broadcast()
	})
	defer stopWake()
	if replyTimeout > 0 {
		p.period = replyTimeout
		p.watchdog = time.AfterFunc(replyTimeout, func() { p.idle(replyTimeout) })
		defer p.watchdog.Stop()
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.write(ctx, window)
	}()
	p.read(ctx)
	cancel()
	wg.Wait()
	p.mu.Lock()
	var left []*pending
	for _, it := range p.items {
		if it.state != itemDone {
			it.state = itemDone
			left = append(left, it)
		}
	}
	err := p.err
	if p.finished {
		err = nil
	}
	p.mu.Unlock()
	for _, it := range left {
		done(it.item, Result{Err: p.failure()})
	}
	return err
}

// pending is one item in flight.
type pending struct {
	item  Item
	state int
}

// pipeline is one DeliverStream call.
type pipeline struct {
	c        *Conn
	next     func() (Item, bool)
	done     func(Item, Result)
	accepted chan *pending // items the peer accepted, in order
	freed    chan struct{} // one per final reply: a window slot
	cancel   context.CancelFunc
	watchdog *time.Timer
	period   time.Duration // the reply timeout the watchdog enforces

	mu        sync.Mutex
	wake      *sync.Cond          // on mu: something in flight, finished or failed
	items     map[string]*pending // by segment id, until done
	inFlight  int                 // items not done
	exhausted bool                // next reported no more items
	finished  bool                // exhausted and every item done: a clean end
	writing   bool                // a write is in progress: replies may wait for it
	err       error               // the first connection failure
}

// fail records the first connection failure and stops both loops.
func (p *pipeline) fail(err error) {
	p.mu.Lock()
	if p.err == nil && !p.finished {
		p.err = err
	}
	p.wake.Broadcast()
	p.mu.Unlock()
	p.cancel()
}

func (p *pipeline) failure() error {
	if p.err != nil {
		return p.err
	}
	return errors.New("delivery stopped")
}

// idle runs when no reply came for replyTimeout: unless a write is still
// in progress (a large SEGMENT takes its time), the peer has stopped
// answering; closing the connection unblocks the reader.
func (p *pipeline) idle(d time.Duration) {
	p.mu.Lock()
	if p.writing {
		p.mu.Unlock()
		p.watchdog.Reset(d)
		return
	}
	if p.finished || p.inFlight == 0 && !p.exhausted {
		// Nothing is owed a reply: the writer is asking next for work.
		p.mu.Unlock()
		p.watchdog.Reset(d)
		return
	}
	if p.err == nil {
		p.err = fmt.Errorf("no reply within %v: %w", d, os.ErrDeadlineExceeded)
	}
	p.mu.Unlock()
	p.c.Close()
	p.cancel()
}

// checkFinished ends the stream cleanly once next is exhausted and every
// item is done; p.mu is held. The reader is then waiting on wake, not in
// a read (it reads only while something is in flight), so the connection
// stays in step for the next stream.
func (p *pipeline) checkFinished() {
	if p.exhausted && p.inFlight == 0 && !p.finished {
		p.finished = true
		p.wake.Broadcast()
	}
}

// write sends offers while the window has room and SEGMENTs in ACCEPT
// order, accepted segments first so the peer's reservations turn over.
func (p *pipeline) write(ctx context.Context, window int) {
	slots := window
	for {
		select {
		case it := <-p.accepted:
			if !p.sendSegment(ctx, it) {
				return
			}
			continue
		default:
		}
		select {
		case <-p.freed:
			slots++
			continue
		default:
		}
		p.mu.Lock()
		exhausted := p.exhausted
		p.mu.Unlock()
		if !exhausted && slots > 0 {
			it, ok := p.next()
			if !ok {
				p.mu.Lock()
				p.exhausted = true
				p.checkFinished()
				p.mu.Unlock()
				continue
			}
			var frames []byte // PUSH and SEGMENT, ready to go
			if it.Push && it.Offer.Size <= MaxPushSize {
				var err error
				if frames, err = pushFrames(it); err != nil {
					// Nothing was sent: this item fails, the stream goes on.
					p.done(it, Result{Err: err})
					continue
				}
			}
			p.mu.Lock()
			if _, dup := p.items[it.Offer.SegmentID]; dup {
				p.mu.Unlock()
				p.done(it, Result{Err: fmt.Errorf("deliver %s: already in flight on this connection", it.Offer.SegmentID)})
				continue
			}
			pd := &pending{item: it, state: itemOffered}
			if frames != nil {
				pd.state = itemSending // no ACCEPT comes for a PUSH
			}
			p.items[it.Offer.SegmentID] = pd
			p.inFlight++
			p.wake.Broadcast()
			p.writing = true
			p.mu.Unlock()
			slots--
			var err error
			if frames != nil {
				err = p.c.send(ctx, "send push "+it.Offer.SegmentID, func(w io.Writer) error {
					_, err := w.Write(frames)
					return err
				})
			} else {
				err = p.c.SendOffer(ctx, it.Offer)
			}
			p.setWriting(false)
			if err != nil {
				p.fail(err)
				return
			}
			continue
		}
		select {
		case it := <-p.accepted:
			if !p.sendSegment(ctx, it) {
				return
			}
		case <-p.freed:
			slots++
		case <-ctx.Done():
			return
		}
	}
}

// pushFrames reads a small item's segment and returns its PUSH and
// SEGMENT frames back to back, to leave in one write. A source that fails
// or ends before Offer.Size bytes is ErrSource, before anything is sent.
func pushFrames(it Item) ([]byte, error) {
	o := it.Offer
	payload, err := EncodeOffer(o)
	if err != nil {
		return nil, fmt.Errorf("push %s: %w", o.SegmentID, err)
	}
	src, err := it.Open()
	if err != nil {
		return nil, fmt.Errorf("push %s: %w: %w", o.SegmentID, ErrSource, err)
	}
	defer src.Close()
	b := AppendFrame(make([]byte, 0, 2*HeaderLen+len(payload)+int(o.Size)), TypePush, payload)
	b = binary.BigEndian.AppendUint32(append(b, byte(TypeSegment)), uint32(o.Size))
	start := len(b)
	b = b[:start+int(o.Size)]
	if _, err := io.ReadFull(src, b[start:]); err != nil {
		return nil, fmt.Errorf("push %s: %w: ended before %d bytes: %w", o.SegmentID, ErrSource, o.Size, err)
	}
	return b, nil
}

func (p *pipeline) setWriting(w bool) {
	p.mu.Lock()
	p.writing = w
	p.mu.Unlock()
}

func (p *pipeline) sendSegment(ctx context.Context, pd *pending) bool {
	it := pd.item
	p.mu.Lock()
	if pd.state != itemAccepted {
		p.mu.Unlock()
		return true // failed meanwhile
	}
	pd.state = itemSending
	p.writing = true
	p.mu.Unlock()
	defer p.setWriting(false)
	src, err := it.Open()
	if err != nil {
		// The peer waits for this SEGMENT; nothing else may be sent.
		p.fail(fmt.Errorf("send segment %s: %w: %w", it.Offer.SegmentID, ErrSource, err))
		return false
	}
	err = p.c.SendSegment(ctx, it.Offer, src)
	src.Close()
	if err != nil {
		p.fail(err)
		return false
	}
	return true
}

// read matches replies to items until the stream finishes or the
// connection fails.
func (p *pipeline) read(ctx context.Context) {
	for {
		p.mu.Lock()
		for p.inFlight == 0 && !p.finished && p.err == nil && ctx.Err() == nil {
			p.wake.Wait()
		}
		stop := p.finished || p.err != nil || ctx.Err() != nil
		p.mu.Unlock()
		if stop {
			return
		}
		var f Frame
		err := p.c.recv(ctx, "recv reply", func(r io.Reader) (bool, error) {
			var err error
			f, err = readControl(r, TypeAccept, TypeAck, TypeNack)
			return err == nil, err
		})
		if err != nil {
			p.fail(err)
			return
		}
		if err := p.reply(f); err != nil {
			p.fail(err)
			return
		}
	}
}

// reply applies one reply frame; an error is the peer breaking the
// protocol. Every reply renews the watchdog.
func (p *pipeline) reply(f Frame) error {
	var (
		id   string
		nack *Nack
		err  error
	)
	switch f.Type {
	case TypeAccept:
		id, err = DecodeAccept(f.Payload)
	case TypeAck:
		id, err = DecodeAck(f.Payload)
	case TypeNack:
		var n Nack
		if n, err = DecodeNack(f.Payload); err == nil {
			id, nack = n.SegmentID, &n
		}
	}
	if err != nil {
		return err
	}
	p.mu.Lock()
	if p.watchdog != nil {
		p.watchdog.Reset(p.period)
	}
	if nack != nil && id == "" {
		// The peer could not decode an offer and will close.
		p.mu.Unlock()
		return &NackError{Nack: *nack}
	}
	pd, ok := p.items[id]
	if !ok {
		p.mu.Unlock()
		return fmt.Errorf("%w: %s for %q, which is not in flight", ErrAckMismatch, f.Type, id)
	}
	var r Result
	switch st := pd.state; {
	case f.Type == TypeAccept && st == itemOffered:
		pd.state = itemAccepted
		p.mu.Unlock()
		p.accepted <- pd // at most a window of items: never blocks
		return nil
	case f.Type == TypeAck && (st == itemOffered || st == itemSending):
		r = Result{Sent: st == itemSending, Replied: true}
	case f.Type == TypeNack && (st == itemOffered || st == itemSending):
		r = Result{Err: &NackError{Nack: *nack}, Sent: st == itemSending, Replied: true}
	default:
		p.mu.Unlock()
		return fmt.Errorf("%w: %s for %q in state %d", ErrAckMismatch, f.Type, id, st)
	}
	pd.state = itemDone
	delete(p.items, id)
	p.inFlight--
	p.freed <- struct{}{} // at most a window outstanding: never blocks
	p.checkFinished()
	p.mu.Unlock()
	p.done(pd.item, r)
	return nil
}
