package wire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// This file is protocol version 2 (docs/wire.md, "Version 2"): the
// receiver's side (RecvRequest, SendAccept, RecvPayload, and SendAck /
// SendNack as final replies) and the sender's (DeliverWindow).

// Request is what a version 2 receiver reads next: an OFFER, or the
// SEGMENT frame of the oldest accepted offer (Segment true; its payload
// is read with RecvPayload before the next RecvRequest).
type Request struct {
	Offer   Offer
	Segment bool
}

// RecvRequest reads the next frame on a version 2 connection. For an
// OFFER it checks the window (ErrWindow) and that the segment id is not
// already in flight (ErrUnexpectedFrame); both leave the stream out of
// step, since the peer no longer follows the protocol. An undecodable
// OFFER is ErrBadMessage with the stream in step: answer NACK bad_request
// and close. A SEGMENT frame belongs to the oldest accepted offer whose
// SEGMENT has not come yet; its length must equal that offer's size.
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
			if h.Length > MaxControlPayload {
				return false, fmt.Errorf("read OFFER frame: %w: %d bytes, limit %d", ErrFrameTooLarge, h.Length, MaxControlPayload)
			}
			p := make([]byte, h.Length)
			if _, err := io.ReadFull(r, p); err != nil {
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF
				}
				return false, fmt.Errorf("read OFFER frame payload: %w", err)
			}
			o, err := DecodeOffer(p)
			if err != nil {
				return true, err
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.open[o.SegmentID] {
				return false, fmt.Errorf("%w: OFFER for %s, which is already in flight", ErrUnexpectedFrame, o.SegmentID)
			}
			if len(c.open) >= c.opt.Window {
				return false, fmt.Errorf("%w: OFFER for %s with %d unanswered, window %d", ErrWindow, o.SegmentID, len(c.open), c.opt.Window)
			}
			c.open[o.SegmentID] = true
			req.Offer = o
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

// Item states in DeliverWindow.
const (
	itemWaiting  = iota // not offered yet
	itemOffered         // OFFER sent, no reply yet
	itemAccepted        // ACCEPT received, SEGMENT not started
	itemSending         // SEGMENT being written or written
	itemDone            // final reply (or failure) recorded
)

// DeliverWindow delivers items over a version 2 connection with up to
// PeerWindow offers in flight, and returns one result per item, in order.
// Replies are matched by segment id, in any order. An ACK is success only
// for an offered or sent segment; an ACCEPT, ACK or NACK naming anything
// else, or an ACK for an accepted segment not yet sent, is the peer
// breaking the protocol (ErrAckMismatch): every unfinished item fails.
//
// replyTimeout bounds the wait for the next reply while nothing is being
// written (zero: no bound besides ctx): a peer that stops answering fails
// the unfinished items and the connection is closed. After any
// connection failure the unfinished items fail with it, and the caller
// must close the Conn. Item ids must be distinct.
func (c *Conn) DeliverWindow(ctx context.Context, items []Item, replyTimeout time.Duration) []Result {
	res := make([]Result, len(items))
	if c.opt.Version < Version2 {
		for i := range res {
			res[i].Err = fmt.Errorf("deliver window: %w: version %d connection", ErrVersion, c.opt.Version)
		}
		return res
	}
	p := &pipeline{c: c, items: items, res: res, state: make([]int, len(items)),
		index: make(map[string]int, len(items)), accepted: make(chan int, len(items)), freed: make(chan struct{}, len(items))}
	for i, it := range items {
		p.index[it.Offer.SegmentID] = i
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.cancel = cancel
	if replyTimeout > 0 {
		p.period = replyTimeout
		p.watchdog = time.AfterFunc(replyTimeout, func() { p.idle(replyTimeout) })
		defer p.watchdog.Stop()
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.write(ctx)
	}()
	p.read(ctx)
	cancel()
	wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range res {
		if p.state[i] != itemDone {
			p.finish(i, Result{Err: p.failure()})
		}
	}
	return res
}

// pipeline is one DeliverWindow call.
type pipeline struct {
	c        *Conn
	items    []Item
	index    map[string]int
	accepted chan int      // items the peer accepted, in order
	freed    chan struct{} // one per final reply: a window slot
	cancel   context.CancelFunc
	watchdog *time.Timer
	period   time.Duration // the reply timeout the watchdog enforces

	mu       sync.Mutex
	res      []Result
	state    []int
	done     int
	writing  bool  // a write is in progress: replies may wait for it
	err      error // the first connection failure
	timedOut bool
}

// fail records the first connection failure and stops both loops.
func (p *pipeline) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
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
	p.timedOut = true
	if p.err == nil {
		p.err = fmt.Errorf("no reply within %v: %w", d, os.ErrDeadlineExceeded)
	}
	p.mu.Unlock()
	p.c.Close()
	p.cancel()
}

// finish records item i's final result; p.mu is held.
func (p *pipeline) finish(i int, r Result) {
	p.state[i] = itemDone
	p.res[i] = r
	p.done++
}

// write sends offers while the window has room and SEGMENTs in ACCEPT
// order, accepted segments first so the peer's reservations turn over.
func (p *pipeline) write(ctx context.Context) {
	window := p.c.PeerWindow()
	next, inFlight := 0, 0
	for {
		select {
		case i := <-p.accepted:
			if !p.sendSegment(ctx, i) {
				return
			}
			continue
		default:
		}
		select {
		case <-p.freed:
			inFlight--
			continue
		default:
		}
		if next < len(p.items) && inFlight < window {
			if !p.sendOffer(ctx, next) {
				return
			}
			next++
			inFlight++
			continue
		}
		select {
		case i := <-p.accepted:
			if !p.sendSegment(ctx, i) {
				return
			}
		case <-p.freed:
			inFlight--
		case <-ctx.Done():
			return
		}
	}
}

func (p *pipeline) setWriting(w bool) {
	p.mu.Lock()
	p.writing = w
	p.mu.Unlock()
}

func (p *pipeline) sendOffer(ctx context.Context, i int) bool {
	p.mu.Lock()
	p.state[i] = itemOffered
	p.writing = true
	p.mu.Unlock()
	err := p.c.SendOffer(ctx, p.items[i].Offer)
	p.setWriting(false)
	if err != nil {
		p.fail(err)
		return false
	}
	return true
}

func (p *pipeline) sendSegment(ctx context.Context, i int) bool {
	it := p.items[i]
	p.mu.Lock()
	if p.state[i] != itemAccepted {
		p.mu.Unlock()
		return true // failed meanwhile
	}
	p.state[i] = itemSending
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

// read matches replies to items until every item has its final reply or
// the connection fails.
func (p *pipeline) read(ctx context.Context) {
	for {
		p.mu.Lock()
		all := p.done == len(p.items)
		p.mu.Unlock()
		if all {
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
	defer p.mu.Unlock()
	if p.watchdog != nil {
		p.watchdog.Reset(p.period)
	}
	if nack != nil && id == "" {
		// The peer could not decode an offer and will close.
		return &NackError{Nack: *nack}
	}
	i, ok := p.index[id]
	if !ok {
		return fmt.Errorf("%w: %s for %q, which was not offered", ErrAckMismatch, f.Type, id)
	}
	st := p.state[i]
	switch {
	case f.Type == TypeAccept && st == itemOffered:
		p.state[i] = itemAccepted
		p.accepted <- i // buffered for every item: never blocks
		return nil
	case f.Type == TypeAck && (st == itemOffered || st == itemSending):
		p.finish(i, Result{Sent: st == itemSending, Replied: true})
	case f.Type == TypeNack && (st == itemOffered || st == itemSending):
		p.finish(i, Result{Err: &NackError{Nack: *nack}, Sent: st == itemSending, Replied: true})
	default:
		return fmt.Errorf("%w: %s for %q in state %d", ErrAckMismatch, f.Type, id, st)
	}
	p.freed <- struct{}{}
	return nil
}
