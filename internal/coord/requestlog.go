package coord

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Request-log retention: a record is needed while its request may still be
// answered or retried (request timeout + the frontends' reply-cache TTL);
// both streams keep RequestLogMaxAge and at most RequestLogMaxBytes.
const (
	RequestLogMaxAge         = 15 * time.Minute
	RequestLogMaxBytes int64 = 1 << 30
	// chunkHeadroom is kept under the server's max payload for headers.
	chunkHeadroom = 8 << 10
	// IncarnationBits is how many high bits of a req_id name the frontend
	// incarnation that assigned it (see FrontendIncarnation).
	IncarnationBits = 24
)

// Headers of log records.
const (
	hdrReqID    = "Hams-Req-Id"
	hdrFrontend = "Hams-Frontend"
	// hdrTimeout is the time the request had left when its record was
	// written, in nanoseconds (serverclock.go). hdrDeadline, the absolute
	// deadline on the writer's clock, is still written for readers of
	// earlier versions and read only from records without hdrTimeout.
	hdrTimeout  = "Hams-Timeout"
	hdrDeadline = "Hams-Deadline"
	hdrCode     = "Hams-Code"
	hdrError    = "Hams-Error"
	hdrChunks   = "Hams-Chunks"
)

// ErrNoRecord is returned by LookupReply when no reply is recorded.
var ErrNoRecord = errors.New("coord: no record")

// ErrBadRecord is wrapped by the errors of a record that cannot be read:
// undecodable, or chunked beyond the bounds (assemble). Anyone who can
// write the streams can write one, so a watch skips such a record (and
// counts it: BadRecords) instead of ending on it.
var ErrBadRecord = errors.New("coord: bad record")

// MaxRecordBytes bounds one assembled record (a request, reply or input
// log record and its chunks): putRecord refuses to write a larger one,
// and assemble stops reading one as soon as it exceeds it, so a record's
// chunk list cannot make a reader allocate more than this.
var MaxRecordBytes = 1 << 30

// RequestsSubject prefixes the request log of deployment dep:
// <prefix>.k.<key hash> holds the record of a request with a client
// request_id (at most one live record per key: the key is claimed with a
// compare-and-set), <prefix>.n.<req_id> one without, and <prefix>.c the
// chunks of records over the max payload.
func RequestsSubject(dep string) string { return "hams." + dep + ".requests" }

// RepliesSubject prefixes the reply records: <prefix>.r.<req_id> (written
// once: the first writer wins) and <prefix>.c their chunks.
func RepliesSubject(dep string) string { return "hams." + dep + ".replies" }

// LoggedRequest is one accepted request as the log keeps it.
type LoggedRequest struct {
	ReqID    uint64
	Frontend string
	// Deadline is on the clock of the process that holds the record: the
	// writer's, or for a record read from the log, the reader's (the log
	// carries the time left, never this time).
	Deadline time.Time
	Request  *hamsv1.PredictRequest
	// Seq is the record's stream sequence (set by reads and by LogRequest).
	Seq uint64
}

// LoggedReply is the answer recorded for a request: a response or a
// non-OK status (Code, Error).
type LoggedReply struct {
	ReqID    uint64
	Frontend string
	Response *hamsv1.PredictResponse
	Code     codes.Code
	Error    string
}

// requestKeySubject is the subject of the record of (service, request_id).
func (c *Coord) requestKeySubject(service, requestID string) string {
	h := sha256.Sum256([]byte(service + "\x00" + requestID))
	return RequestsSubject(c.deployment) + ".k." + hex.EncodeToString(h[:16])
}

func (c *Coord) replySubject(reqID uint64) string {
	return RepliesSubject(c.deployment) + ".r." + strconv.FormatUint(reqID, 10)
}

func (c *Coord) openRequestLog(ctx context.Context, replicas int) error {
	for _, sc := range []jetstream.StreamConfig{
		{
			Name:     streamName(c.deployment, "REQUESTS"),
			Subjects: []string{RequestsSubject(c.deployment) + ".>"},
			Storage:  jetstream.FileStorage, Replicas: replicas,
			MaxAge: RequestLogMaxAge, MaxBytes: RequestLogMaxBytes, Discard: jetstream.DiscardOld,
		},
		{
			Name:     streamName(c.deployment, "REPLIES"),
			Subjects: []string{RepliesSubject(c.deployment) + ".>"},
			Storage:  jetstream.FileStorage, Replicas: replicas,
			MaxAge: RequestLogMaxAge, MaxBytes: RequestLogMaxBytes, Discard: jetstream.DiscardOld,
		},
	} {
		sc.Replicas = replicasFor(ctx, c.js, sc.Name, replicas)
		if _, err := c.js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("coord: create stream %s: %w", sc.Name, err)
		}
	}
	kv, err := c.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: streamName(c.deployment, "FRONTENDS"), Storage: jetstream.FileStorage, History: 1,
		Replicas: replicasFor(ctx, c.js, "KV_"+FrontendsBucket(c.deployment), replicas),
	})
	if err != nil {
		return fmt.Errorf("coord: create frontends bucket: %w", err)
	}
	c.frontends = kv
	return nil
}

// FrontendIncarnation allocates a number no other frontend process of the
// deployment ever got (a compare-and-set counter in the frontends bucket),
// in 1 .. 2^IncarnationBits-1. A frontend puts it in the high bits of its
// req_ids, so the req_ids of all frontends, restarts included, never
// collide.
func (c *Coord) FrontendIncarnation(ctx context.Context) (uint64, error) {
	const key = "incarnation"
	for {
		e, err := c.frontends.Get(ctx, key)
		var n uint64
		var rev uint64
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return 0, fmt.Errorf("coord: read frontend incarnation: %w", err)
		default:
			n, err = strconv.ParseUint(string(e.Value()), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("coord: frontend incarnation %q: %w", e.Value(), err)
			}
			rev = e.Revision()
		}
		next := n%(1<<IncarnationBits-1) + 1
		val := []byte(strconv.FormatUint(next, 10))
		if rev == 0 {
			_, err = c.frontends.Create(ctx, key, val)
		} else {
			_, err = c.frontends.Update(ctx, key, val, rev)
		}
		if err == nil {
			return next, nil
		}
		if !isWrongLast(err) && !errors.Is(err, jetstream.ErrKeyExists) {
			return 0, fmt.Errorf("coord: allocate frontend incarnation: %w", err)
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
}

func isWrongLast(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}

// LogRequest appends r to the request log and returns once JetStream
// acknowledged it. A request with a client request_id claims its key: when
// the key holds a live record already (another attempt of the same request,
// on any frontend), nothing is written and that record is returned
// instead. A record whose deadline passed without a reply is replaced
// (the retry executes again).
func (c *Coord) LogRequest(ctx context.Context, r *LoggedRequest) (existing *LoggedRequest, err error) {
	h, body, err := encodeRequest(r, c.now())
	if err != nil {
		return nil, err
	}
	if r.Request.GetRequestId() == "" {
		seq, err := c.putRecord(ctx, RequestsSubject(c.deployment), RequestsSubject(c.deployment)+".n."+strconv.FormatUint(r.ReqID, 10), h, body, nil)
		r.Seq = seq
		return nil, err
	}
	subj := c.requestKeySubject(r.Request.GetService(), r.Request.GetRequestId())
	var expect uint64
	for attempt := 0; ; attempt++ {
		seq, err := c.putRecord(ctx, RequestsSubject(c.deployment), subj, h, body, []jetstream.PublishOpt{jetstream.WithExpectLastSequencePerSubject(expect)})
		if err == nil {
			r.Seq = seq
			return nil, nil
		}
		if !isWrongLast(err) || attempt > 8 {
			return nil, err
		}
		prev, err := c.lastRequest(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			expect = 0 // expired in between
			continue
		}
		if err != nil {
			return nil, err
		}
		if c.now().Before(prev.Deadline) {
			return prev, nil
		}
		if _, err := c.LookupReply(ctx, prev.ReqID); err == nil {
			return prev, nil
		} else if !errors.Is(err, ErrNoRecord) {
			return nil, err
		}
		expect = prev.Seq
	}
}

// encodeRequest is a request record's headers and data written at now
// (decodeRequest reads them).
func encodeRequest(r *LoggedRequest, now time.Time) (nats.Header, []byte, error) {
	body, err := proto.Marshal(r.Request)
	if err != nil {
		return nil, nil, fmt.Errorf("coord: encode request %d: %w", r.ReqID, err)
	}
	h := nats.Header{}
	h.Set(hdrReqID, strconv.FormatUint(r.ReqID, 10))
	h.Set(hdrFrontend, r.Frontend)
	h.Set(hdrTimeout, strconv.FormatInt(int64(clampTimeout(r.Deadline.Sub(now))), 10))
	h.Set(hdrDeadline, strconv.FormatInt(r.Deadline.UnixNano(), 10))
	return h, body, nil
}

func (c *Coord) lastRequest(ctx context.Context, subj string) (*LoggedRequest, error) {
	st, err := c.js.Stream(ctx, streamName(c.deployment, "REQUESTS"))
	if err != nil {
		return nil, fmt.Errorf("coord: request log: %w", err)
	}
	m, err := st.GetLastMsgForSubject(ctx, subj)
	if err != nil {
		return nil, err
	}
	off, err := c.ServerClockOffset(ctx)
	if err != nil {
		return nil, err
	}
	data, err := c.assemble(ctx, st, m.Header, m.Data)
	if err == nil {
		var r *LoggedRequest
		if r, err = decodeRequest(m.Header, data, m.Sequence, m.Time.Add(off)); err == nil {
			return r, nil
		}
	}
	if errors.Is(err, ErrBadRecord) {
		// Nobody can read it, so nobody waits on it: it is replaced
		// as an expired record is.
		c.badRecords.Add(1)
		return &LoggedRequest{Seq: m.Sequence}, nil
	}
	return nil, err
}

// BadRecords counts the records this Coord skipped or replaced because
// they could not be read (ErrBadRecord).
func (c *Coord) BadRecords() uint64 { return c.badRecords.Load() }

// putRecord publishes data on subj, chunked over chunkSubj when it does
// not fit the server's max payload: the chunks first, then the record on
// subj naming their stream sequences (header Hams-Chunks). opts apply to
// the record. It returns the record's stream sequence.
func (c *Coord) putRecord(ctx context.Context, prefix, subj string, h nats.Header, data []byte, opts []jetstream.PublishOpt) (uint64, error) {
	if len(data) > MaxRecordBytes {
		return 0, fmt.Errorf("coord: record %s of %d bytes is over the %d-byte record limit", subj, len(data), MaxRecordBytes)
	}
	limit := c.chunkBytes()
	if len(data) > limit {
		var seqs []string
		for off := 0; off < len(data); off += limit {
			end := min(off+limit, len(data))
			ack, err := c.js.Publish(ctx, prefix+".c", data[off:end])
			if err != nil {
				return 0, fmt.Errorf("coord: publish chunk of %s: %w", subj, err)
			}
			seqs = append(seqs, strconv.FormatUint(ack.Sequence, 10))
		}
		h.Set(hdrChunks, strings.Join(seqs, ","))
		data = nil
	}
	ack, err := c.js.PublishMsg(ctx, &nats.Msg{Subject: subj, Header: h, Data: data}, opts...)
	if err != nil {
		return 0, fmt.Errorf("coord: publish %s: %w", subj, err)
	}
	return ack.Sequence, nil
}

// chunkBytes is the size of the chunks putRecord writes.
func (c *Coord) chunkBytes() int {
	return max(int(c.js.Conn().MaxPayload())-chunkHeadroom, 1024)
}

// assemble returns a record's data, fetching its chunks if it has any.
// The chunk list is checked before any chunk is fetched: at most as many
// chunks as a record of MaxRecordBytes has, in increasing stream order
// (as putRecord writes them: one chunk cannot be named twice to make a
// small stream assemble into a large record), and the data stops growing
// at MaxRecordBytes. Errors wrap ErrBadRecord, except failures to fetch a
// chunk.
func (c *Coord) assemble(ctx context.Context, st jetstream.Stream, h nats.Header, data []byte) ([]byte, error) {
	list := h.Get(hdrChunks)
	if list == "" {
		return data, nil
	}
	seqs, err := parseChunks(list, MaxRecordBytes/c.chunkBytes()+1)
	if err != nil {
		return nil, err
	}
	var out []byte
	for _, seq := range seqs {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			return nil, fmt.Errorf("coord: chunk %d: %w", seq, err)
		}
		if len(out)+len(m.Data) > MaxRecordBytes {
			return nil, fmt.Errorf("%w: chunks of more than %d bytes", ErrBadRecord, MaxRecordBytes)
		}
		out = append(out, m.Data...)
	}
	return out, nil
}

// parseChunks reads a Hams-Chunks list: at most most stream sequences,
// strictly increasing.
func parseChunks(list string, most int) ([]uint64, error) {
	if n := strings.Count(list, ",") + 1; n > most {
		return nil, fmt.Errorf("%w: %d chunks, a record has at most %d", ErrBadRecord, n, most)
	}
	var seqs []uint64
	for _, s := range strings.Split(list, ",") {
		seq, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: chunk list: %q is not a stream sequence", ErrBadRecord, s)
		}
		if len(seqs) > 0 && seq <= seqs[len(seqs)-1] {
			return nil, fmt.Errorf("%w: chunk list: sequence %d after %d (chunks are in increasing order)", ErrBadRecord, seq, seqs[len(seqs)-1])
		}
		seqs = append(seqs, seq)
	}
	return seqs, nil
}

// decodeRequest reads a request record written at written (the server's
// stamp of it, on the reader's clock: serverclock.go). Errors wrap
// ErrBadRecord.
func decodeRequest(h nats.Header, data []byte, seq uint64, written time.Time) (*LoggedRequest, error) {
	id, err := strconv.ParseUint(h.Get(hdrReqID), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%w: request record %d: req_id %q: %v", ErrBadRecord, seq, h.Get(hdrReqID), err)
	}
	var deadline time.Time
	if s := h.Get(hdrTimeout); s != "" {
		left, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: request record %d: time left %q: %v", ErrBadRecord, seq, s, err)
		}
		deadline = written.Add(clampTimeout(time.Duration(left)))
	} else {
		// A record of an earlier version: its writer's clock.
		dl, err := strconv.ParseInt(h.Get(hdrDeadline), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: request record %d: deadline %q: %v", ErrBadRecord, seq, h.Get(hdrDeadline), err)
		}
		deadline = time.Unix(0, dl)
	}
	req := &hamsv1.PredictRequest{}
	if err := proto.Unmarshal(data, req); err != nil {
		return nil, fmt.Errorf("%w: request record %d: %v", ErrBadRecord, seq, err)
	}
	return &LoggedRequest{ReqID: id, Frontend: h.Get(hdrFrontend), Deadline: deadline, Request: req, Seq: seq}, nil
}

// RecordReply records the answer to request r.ReqID once: the first writer
// wins. When an answer is recorded already (another frontend completed the
// same request), nothing is written and that answer is returned.
func (c *Coord) RecordReply(ctx context.Context, r *LoggedReply) (existing *LoggedReply, err error) {
	h, body, err := encodeReply(r)
	if err != nil {
		return nil, err
	}
	_, err = c.putRecord(ctx, RepliesSubject(c.deployment), c.replySubject(r.ReqID), h, body,
		[]jetstream.PublishOpt{jetstream.WithExpectLastSequencePerSubject(0)})
	if err == nil {
		return nil, nil
	}
	if !isWrongLast(err) {
		return nil, err
	}
	prev, lerr := c.LookupReply(ctx, r.ReqID)
	if lerr != nil {
		return nil, fmt.Errorf("coord: reply %d recorded by another frontend, but reading it: %w", r.ReqID, lerr)
	}
	return prev, nil
}

// encodeReply is a reply record's headers and data (decodeReply reads
// them).
func encodeReply(r *LoggedReply) (nats.Header, []byte, error) {
	var body []byte
	if r.Response != nil {
		var err error
		if body, err = proto.Marshal(r.Response); err != nil {
			return nil, nil, fmt.Errorf("coord: encode reply %d: %w", r.ReqID, err)
		}
	}
	h := nats.Header{}
	h.Set(hdrReqID, strconv.FormatUint(r.ReqID, 10))
	h.Set(hdrFrontend, r.Frontend)
	if r.Code != codes.OK {
		h.Set(hdrCode, strconv.Itoa(int(r.Code)))
		h.Set(hdrError, r.Error)
	}
	return h, body, nil
}

// LookupReply returns the answer recorded for reqID, or ErrNoRecord.
func (c *Coord) LookupReply(ctx context.Context, reqID uint64) (*LoggedReply, error) {
	st, err := c.js.Stream(ctx, streamName(c.deployment, "REPLIES"))
	if err != nil {
		return nil, fmt.Errorf("coord: reply records: %w", err)
	}
	m, err := st.GetLastMsgForSubject(ctx, c.replySubject(reqID))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, ErrNoRecord
	}
	if err != nil {
		return nil, fmt.Errorf("coord: look up reply %d: %w", reqID, err)
	}
	data, err := c.assemble(ctx, st, m.Header, m.Data)
	if err != nil {
		return nil, err
	}
	return decodeReply(m.Header, data)
}

// decodeReply reads a reply record (errors wrap ErrBadRecord).
func decodeReply(h nats.Header, data []byte) (*LoggedReply, error) {
	id, err := strconv.ParseUint(h.Get(hdrReqID), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%w: reply record: req_id %q: %v", ErrBadRecord, h.Get(hdrReqID), err)
	}
	r := &LoggedReply{ReqID: id, Frontend: h.Get(hdrFrontend)}
	if s := h.Get(hdrCode); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 || n > int(codes.Unauthenticated) {
			return nil, fmt.Errorf("%w: reply record %d: code %q is not a gRPC error code", ErrBadRecord, id, s)
		}
		r.Code, r.Error = codes.Code(n), h.Get(hdrError)
		return r, nil
	}
	r.Response = &hamsv1.PredictResponse{}
	if err := proto.Unmarshal(data, r.Response); err != nil {
		return nil, fmt.Errorf("%w: reply record %d: %v", ErrBadRecord, id, err)
	}
	return r, nil
}

// WatchReplies calls fn for every reply record written from now on (a core
// NATS subscription: records published while the connection is down are
// missed; callers look the ones they wait for up with LookupReply as a
// backstop). fn runs on one goroutine.
func (c *Coord) WatchReplies(ctx context.Context, fn func(*LoggedReply)) error {
	ch := make(chan *nats.Msg, 1024)
	sub, err := c.js.Conn().ChanSubscribe(RepliesSubject(c.deployment)+".r.*", ch)
	if err != nil {
		return fmt.Errorf("coord: subscribe to reply records: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	var st jetstream.Stream
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-ch:
			data := m.Data
			if m.Header.Get(hdrChunks) != "" {
				if st == nil {
					if st, err = c.js.Stream(ctx, streamName(c.deployment, "REPLIES")); err != nil {
						return fmt.Errorf("coord: reply records: %w", err)
					}
				}
				if data, err = c.assemble(ctx, st, m.Header, nil); err != nil {
					if errors.Is(err, ErrBadRecord) {
						c.badRecords.Add(1)
						continue
					}
					return err
				}
			}
			r, err := decodeReply(m.Header, data)
			if err != nil {
				c.badRecords.Add(1) // skipped: LookupReply reports it to whoever asks
				continue
			}
			fn(r)
		}
	}
}

// WatchRequests calls fn for every request record logged in the last
// lookback (and every later one), in log order, until ctx ends. backlog is
// true for records that were in the log when the watch started. fn runs
// on one goroutine and may block (the watch then pauses). lookback is
// measured on the server's clock (serverclock.go), so a reader whose clock
// is skewed still starts where it means to.
func (c *Coord) WatchRequests(ctx context.Context, lookback time.Duration, fn func(r *LoggedRequest, backlog bool)) error {
	name := streamName(c.deployment, "REQUESTS")
	st, err := c.js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("coord: request log: %w", err)
	}
	off, err := c.ServerClockOffset(ctx)
	if err != nil {
		return err
	}
	since := c.now().Add(-off).Add(-lookback)
	info, err := st.Info(ctx)
	if err != nil {
		return fmt.Errorf("coord: request log info: %w", err)
	}
	last := info.State.LastSeq
	p := RequestsSubject(c.deployment)
	cons, err := c.js.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{p + ".k.*", p + ".n.*"},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &since,
	})
	if err != nil {
		return fmt.Errorf("coord: consumer on %s: %w", name, err)
	}
	for {
		it, err := cons.Messages()
		if err != nil {
			return fmt.Errorf("coord: consume %s: %w", name, err)
		}
		err = func() error {
			defer it.Stop()
			for {
				m, err := it.Next(jetstream.NextContext(ctx))
				if err != nil {
					return err
				}
				md, err := m.Metadata()
				if err != nil {
					return fmt.Errorf("coord: request record metadata: %w", err)
				}
				data, err := c.assemble(ctx, st, m.Headers(), m.Data())
				if errors.Is(err, ErrBadRecord) {
					c.badRecords.Add(1)
					continue
				}
				if err != nil {
					return err
				}
				if off, err = c.ServerClockOffset(ctx); err != nil {
					return err
				}
				r, err := decodeRequest(m.Headers(), data, md.Sequence.Stream, md.Timestamp.Add(off))
				if err != nil {
					// A record nobody can read is skipped: ending the
					// watch on it would stop every later request (a
					// restarted watch meets it again).
					c.badRecords.Add(1)
					continue
				}
				fn(r, md.Sequence.Stream <= last)
			}
		}()
		if ctx.Err() != nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return err
		}
	}
}
