package coord

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Replay mode's storage (the Lineage-Stash-style baseline), per deployment
// D:
//   - stream HAMS_D_REPLAY, subjects hams.D.replay.<model>.b: the input log,
//     one hamsv1.ReplayBatch per executed batch, published asynchronously
//     off the request path with Nats-Msg-Id r/<model>/<epoch>/<batch_id>
//     (a retried publish is stored once); records over the max payload are
//     chunked on hams.D.replay.<model>.c as in the request log. A model's
//     records up to its latest checkpoint are purged (Trim) once the
//     checkpoint is stored.
//   - object store bucket HAMS_D_CKPT, object <model>/<epoch, 20 digits>:
//     the model's latest checkpoint taken at that epoch, a varint-length
//     prefixed hamsv1.ReplayCheckpoint followed by the state bytes. The
//     newest epoch's object is the checkpoint; saving one deletes the
//     model's objects of older epochs (a deposed instance that is still
//     running can only write under its own, older epoch).
//
// Both live on whatever JetStream the deployment uses (the manager's
// embedded server or an external cluster), so a replacement on another
// host reads them. File storage without SyncAlways, as the other streams
// (doc.go): an acknowledged record survives any process crash.

// ErrNoCheckpoint is returned by LoadCheckpoint when the model has none.
var ErrNoCheckpoint = errors.New("coord: no checkpoint")

// replayStreamMaxBytes bounds the input log stream (all models).
const replayStreamMaxBytes int64 = 4 << 30

// replayAckWait bounds the wait for one asynchronous publish's ack.
const replayAckWait = 5 * time.Second

// ReplaySubject prefixes model's input log: <prefix>.b records, <prefix>.c
// chunks.
func ReplaySubject(dep, model string) string { return "hams." + dep + ".replay." + model }

// Replay is replay mode's input log and checkpoint store. Safe for
// concurrent use.
type Replay struct {
	c   *Coord
	st  jetstream.Stream
	obs jetstream.ObjectStore
}

// OpenReplay creates (or updates) the deployment's input log stream and
// checkpoint bucket. replicas is 1 on the embedded default, 3 on a
// cluster; an existing stream with more keeps them (replicasFor).
func (c *Coord) OpenReplay(ctx context.Context, replicas int) (*Replay, error) {
	name := streamName(c.deployment, "REPLAY")
	st, err := c.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       name,
		Subjects:   []string{"hams." + c.deployment + ".replay.>"},
		Storage:    jetstream.FileStorage,
		Replicas:   replicasFor(ctx, c.js, name, replicas),
		MaxBytes:   replayStreamMaxBytes,
		Duplicates: 2 * time.Minute,
		Discard:    jetstream.DiscardOld,
	})
	if err != nil {
		return nil, fmt.Errorf("coord: create stream %s: %w", name, err)
	}
	bucket := streamName(c.deployment, "CKPT")
	obs, err := c.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket: bucket, Storage: jetstream.FileStorage, Replicas: replicasFor(ctx, c.js, "OBJ_"+bucket, replicas),
		Description: "HAMS replay-mode checkpoints of " + c.deployment,
	})
	if err != nil {
		return nil, fmt.Errorf("coord: create object store %s: %w", bucket, err)
	}
	return &Replay{c: c, st: st, obs: obs}, nil
}

// checkpointName is the object of model's checkpoint taken at epoch.
func checkpointName(model string, epoch uint64) string {
	return fmt.Sprintf("%s/%020d", model, epoch)
}

// checkpointEpoch parses an object name of model; ok is false for another
// model's object.
func checkpointEpoch(model, name string) (uint64, bool) {
	rest, found := strings.CutPrefix(name, model+"/")
	if !found || len(rest) != 20 {
		return 0, false
	}
	e, err := strconv.ParseUint(rest, 10, 64)
	return e, err == nil
}

// Reset forgets model's input log and checkpoints: the model's history
// starts afresh (its first primary starts with the initial state).
func (r *Replay) Reset(ctx context.Context, model string) error {
	if err := r.st.Purge(ctx, jetstream.WithPurgeSubject(ReplaySubject(r.c.deployment, model)+".>")); err != nil {
		return fmt.Errorf("coord: purge input log of %s: %w", model, err)
	}
	objs, err := r.checkpoints(ctx, model)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if err := r.obs.Delete(ctx, o.name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return fmt.Errorf("coord: delete checkpoint %s: %w", o.name, err)
		}
	}
	return nil
}

type ckptObj struct {
	name  string
	epoch uint64
}

// checkpoints lists model's checkpoint objects, newest epoch first.
func (r *Replay) checkpoints(ctx context.Context, model string) ([]ckptObj, error) {
	infos, err := r.obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("coord: list checkpoints: %w", err)
	}
	var out []ckptObj
	for _, in := range infos {
		if e, ok := checkpointEpoch(model, in.Name); ok && !in.Deleted {
			out = append(out, ckptObj{in.Name, e})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].epoch > out[j].epoch })
	return out, nil
}

// Append logs batches (all of one model) and returns each one's stream
// sequence, in order. The records are published asynchronously and the
// call waits for every acknowledgement; on error the sequences of those
// acknowledged before the first failure are returned with it (a retry of
// the rest stores nothing twice: records carry a message id).
func (r *Replay) Append(ctx context.Context, batches []*hamsv1.ReplayBatch) ([]uint64, error) {
	if len(batches) == 0 {
		return nil, nil
	}
	limit := int(r.c.js.Conn().MaxPayload()) - chunkHeadroom
	ps := make([]ackWait, len(batches))
	for i, b := range batches {
		data, err := proto.Marshal(b)
		if err != nil {
			return seqsOf(ps[:i]), fmt.Errorf("coord: encode batch %d of %s: %w", b.GetBatchId(), b.GetModel(), err)
		}
		prefix := ReplaySubject(r.c.deployment, b.GetModel())
		id := jetstream.WithMsgID(fmt.Sprintf("r/%s/%d/%d", b.GetModel(), b.GetEpoch(), b.GetBatchId()))
		if len(data) > limit {
			// Rare (a batch over the max payload): chunked, synchronously.
			seq, err := r.c.putRecord(ctx, prefix, prefix+".b", nats.Header{}, data, []jetstream.PublishOpt{id})
			if err != nil {
				return seqsOf(ps[:i]), err
			}
			ps[i].seq = seq
			continue
		}
		f, err := r.c.js.PublishMsgAsync(&nats.Msg{Subject: prefix + ".b", Data: data}, id)
		if err != nil {
			return seqsOf(ps[:i]), fmt.Errorf("coord: publish batch %d of %s: %w", b.GetBatchId(), b.GetModel(), err)
		}
		ps[i].f = f
	}
	wait := time.NewTimer(replayAckWait)
	defer wait.Stop()
	for i := range ps {
		if ps[i].f == nil {
			continue
		}
		select {
		case ack := <-ps[i].f.Ok():
			ps[i].seq = ack.Sequence
		case err := <-ps[i].f.Err():
			return seqsOf(ps[:i]), fmt.Errorf("coord: log batch %d of %s: %w", batches[i].GetBatchId(), batches[i].GetModel(), err)
		case <-wait.C:
			return seqsOf(ps[:i]), fmt.Errorf("coord: log batch %d of %s: no acknowledgement within %v", batches[i].GetBatchId(), batches[i].GetModel(), replayAckWait)
		case <-ctx.Done():
			return seqsOf(ps[:i]), fmt.Errorf("coord: log batch %d of %s: %w", batches[i].GetBatchId(), batches[i].GetModel(), ctx.Err())
		}
	}
	return seqsOf(ps), nil
}

// ackWait is one record of an Append: its publish future (nil when it
// was published synchronously) and, once acknowledged, its sequence.
type ackWait struct {
	f   jetstream.PubAckFuture
	seq uint64
}

func seqsOf(ps []ackWait) []uint64 {
	out := make([]uint64, len(ps))
	for i, p := range ps {
		out[i] = p.seq
	}
	return out
}

// Batches returns model's logged batches with batch_id above after, in
// stream order (records of several epochs may name one batch_id: choosing
// among them is the caller's). It reads up to the last record stored when
// it is called.
func (r *Replay) Batches(ctx context.Context, model string, after uint64) ([]*hamsv1.ReplayBatch, error) {
	subj := ReplaySubject(r.c.deployment, model) + ".b"
	last, err := r.st.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("coord: last input log record of %s: %w", model, err)
	}
	cons, err := r.st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		return nil, fmt.Errorf("coord: read input log of %s: %w", model, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("coord: read input log of %s: %w", model, err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	var out []*hamsv1.ReplayBatch
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return nil, fmt.Errorf("coord: read input log of %s: %w", model, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, fmt.Errorf("coord: input log record of %s: %w", model, err)
		}
		data, err := r.c.assemble(ctx, r.st, m.Headers(), m.Data())
		if err != nil {
			return nil, err
		}
		b := &hamsv1.ReplayBatch{}
		if err := proto.Unmarshal(data, b); err != nil {
			return nil, fmt.Errorf("coord: decode input log record %d of %s: %w", md.Sequence.Stream, model, err)
		}
		if b.GetBatchId() > after {
			out = append(out, b)
		}
		if md.Sequence.Stream >= last.Sequence {
			return out, nil
		}
	}
}

// Trim drops model's input log records (and chunks) up to stream
// sequence seq, inclusive: a checkpoint covers them.
func (r *Replay) Trim(ctx context.Context, model string, seq uint64) error {
	if err := r.st.Purge(ctx, jetstream.WithPurgeSubject(ReplaySubject(r.c.deployment, model)+".>"), jetstream.WithPurgeSequence(seq+1)); err != nil {
		return fmt.Errorf("coord: trim input log of %s to %d: %w", model, seq, err)
	}
	return nil
}

// SaveCheckpoint stores ck (state_tensors, state_bytes and state_digest
// are filled in from state) as model's checkpoint of ck.Epoch, then
// deletes the model's checkpoints of older epochs.
func (r *Replay) SaveCheckpoint(ctx context.Context, ck *hamsv1.ReplayCheckpoint, state []*hamsv1.Tensor) error {
	h := sha256.New()
	ck.StateTensors, ck.StateBytes = ck.StateTensors[:0], 0
	readers := make([]io.Reader, 0, len(state)+1)
	for _, t := range state {
		ck.StateTensors = append(ck.StateTensors, &hamsv1.TensorSpec{Name: t.GetName(), Datatype: t.GetDatatype(), Shape: t.GetShape()})
		ck.StateBytes += uint64(len(t.GetData()))
		h.Write(t.GetData())
		readers = append(readers, bytes.NewReader(t.GetData()))
	}
	ck.StateDigest = hex.EncodeToString(h.Sum(nil))
	head, err := proto.Marshal(ck)
	if err != nil {
		return fmt.Errorf("coord: encode checkpoint of %s: %w", ck.GetModel(), err)
	}
	prefix := binary.AppendUvarint(nil, uint64(len(head)))
	readers = append([]io.Reader{bytes.NewReader(append(prefix, head...))}, readers...)
	name := checkpointName(ck.GetModel(), ck.GetEpoch())
	if _, err := r.obs.Put(ctx, jetstream.ObjectMeta{Name: name}, io.MultiReader(readers...)); err != nil {
		return fmt.Errorf("coord: store checkpoint %s (batch %d): %w", name, ck.GetBatchId(), err)
	}
	objs, err := r.checkpoints(ctx, ck.GetModel())
	if err != nil {
		return err
	}
	for _, o := range objs {
		if o.epoch < ck.GetEpoch() {
			if err := r.obs.Delete(ctx, o.name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
				return fmt.Errorf("coord: delete old checkpoint %s: %w", o.name, err)
			}
		}
	}
	return nil
}

// LoadCheckpoint returns model's newest checkpoint (the highest epoch's)
// and its state tensors, verified against the stored digest, or
// ErrNoCheckpoint.
func (r *Replay) LoadCheckpoint(ctx context.Context, model string) (*hamsv1.ReplayCheckpoint, []*hamsv1.Tensor, error) {
	objs, err := r.checkpoints(ctx, model)
	if err != nil {
		return nil, nil, err
	}
	for _, o := range objs {
		ck, state, err := r.loadObject(ctx, o.name)
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			continue // deleted since the listing
		}
		return ck, state, err
	}
	return nil, nil, fmt.Errorf("%w of %s", ErrNoCheckpoint, model)
}

func (r *Replay) loadObject(ctx context.Context, name string) (*hamsv1.ReplayCheckpoint, []*hamsv1.Tensor, error) {
	res, err := r.obs.Get(ctx, name)
	if err != nil {
		return nil, nil, fmt.Errorf("coord: get checkpoint %s: %w", name, err)
	}
	defer res.Close()
	info, err := res.Info()
	if err != nil {
		return nil, nil, fmt.Errorf("coord: checkpoint %s: %w", name, err)
	}
	return decodeCheckpoint(name, res, info.Size)
}

// decodeCheckpoint reads a checkpoint object of size bytes from r: a
// uvarint header length, the header, the state. Every length is checked
// against what is left of the object before its buffer is allocated.
func decodeCheckpoint(name string, r io.Reader, size uint64) (*hamsv1.ReplayCheckpoint, []*hamsv1.Tensor, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	n, err := binary.ReadUvarint(br)
	if err != nil {
		return nil, nil, fmt.Errorf("coord: checkpoint %s: header length: %w", name, err)
	}
	prefix := uint64(len(binary.AppendUvarint(nil, n)))
	if prefix > size || n > size-prefix {
		return nil, nil, fmt.Errorf("coord: checkpoint %s: a header of %d bytes in an object of %d", name, n, size)
	}
	head := make([]byte, n)
	if _, err := io.ReadFull(br, head); err != nil {
		return nil, nil, fmt.Errorf("coord: checkpoint %s: read header: %w", name, err)
	}
	ck := &hamsv1.ReplayCheckpoint{}
	if err := proto.Unmarshal(head, ck); err != nil {
		return nil, nil, fmt.Errorf("coord: checkpoint %s: decode header: %w", name, err)
	}
	if want := size - prefix - n; ck.GetStateBytes() != want {
		return nil, nil, fmt.Errorf("coord: checkpoint %s: header says %d state bytes, the object holds %d", name, ck.GetStateBytes(), want)
	}
	data := make([]byte, ck.GetStateBytes())
	if _, err := io.ReadFull(br, data); err != nil {
		return nil, nil, fmt.Errorf("coord: checkpoint %s: read %d state bytes: %w", name, len(data), err)
	}
	if extra, _ := br.Read(make([]byte, 1)); extra != 0 {
		return nil, nil, fmt.Errorf("coord: checkpoint %s: bytes beyond its %d state bytes", name, len(data))
	}
	if d := sha256.Sum256(data); hex.EncodeToString(d[:]) != ck.GetStateDigest() {
		return nil, nil, fmt.Errorf("coord: checkpoint %s: state digest mismatch", name)
	}
	state, err := tensor.SplitBySpecs(ck.GetStateTensors(), data)
	if err != nil {
		return nil, nil, fmt.Errorf("coord: checkpoint %s: %w", name, err)
	}
	return ck, state, nil
}
