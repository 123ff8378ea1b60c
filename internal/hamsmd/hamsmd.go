// Package hamsmd is the request identity HAMS puts on the calls it makes
// to model servers on a client's behalf, so a backend, a proxy or their
// logs can correlate a call with HAMS's records (audit logs, replies'
// lineage, the frontend's req_ids).
//
// Keys (gRPC metadata; HTTP headers of the same names for Clipper's REST
// API):
//
//   - hams-req-id: the frontend's req_id of a request the call carries,
//     as a decimal string; one value per request, in row order (a
//     sidecar's batch carries several).
//   - hams-lineage-bin: a serialized hams.v1.CallLineage per request, in
//     the same order: req_id, service, stream id, the model called, and
//     the lineage the request carries into the call (entries of the models
//     it went through, output digests left out). Binary metadata: gRPC
//     sends it base64-encoded and hands it back decoded; over HTTP it is
//     base64 (standard alphabet, no padding).
//   - hams-truncated: present when the values above were cut to keep the
//     metadata under its byte budget (DefaultBudget): the number of
//     requests of the call that are not listed. Lineage values are dropped
//     first (req_ids are kept as long as they fit).
//
// The budget exists because model servers bound metadata: gRPC C++ (TF
// Serving, Triton) refuses a call whose metadata exceeds 8 KiB by
// default, and a large batch with long lineages would cross it.
//
// Who sets them: the frontend on every pass-through call (ha: off models
// served without a sidecar: one request per call), and every sidecar on
// its backend calls that run a batch (Predict, ModelInfer, ModelRuntime
// Infer and Compute), through UnaryClientInterceptor on the backend
// connection, which asks the Source the sidecar puts on its context.
// Metadata a client sends under these keys never reaches a backend: the
// frontend drops it and sets its own.
package hamsmd

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Metadata keys.
const (
	KeyReqID     = "hams-req-id"
	KeyLineage   = "hams-lineage-bin"
	KeyTruncated = "hams-truncated"
	// Prefix is reserved for HAMS: a client's metadata under it is dropped
	// before a pass-through call.
	Prefix = "hams-"
	// DefaultBudget bounds the bytes of the values HAMS adds to one call
	// (keys and framing come on top), well under the 8 KiB metadata
	// limit of gRPC C++ servers.
	DefaultBudget = 4096
)

// BatchMethods are the backend methods that run a batch of requests: the
// interceptor attaches the batch's identity to these calls only (health,
// metadata and state calls carry none).
var BatchMethods = map[string]bool{
	"/tensorflow.serving.PredictionService/Predict": true,
	"/inference.GRPCInferenceService/ModelInfer":    true,
	"/hams.v1.ModelRuntime/Infer":                   true,
	"/hams.v1.ModelRuntime/Compute":                 true,
}

// Source gives the identity of the requests of the batch a call runs (the
// sidecar: at most one batch computes at a time). It returns nil when no
// batch is in flight.
type Source interface {
	BatchLineage() []*hamsv1.CallLineage
}

type sourceKey struct{}

// WithSource returns ctx carrying src for UnaryClientInterceptor.
func WithSource(ctx context.Context, src Source) context.Context {
	return context.WithValue(ctx, sourceKey{}, src)
}

// UnaryClientInterceptor attaches, to every call of a BatchMethods method
// whose context carries a Source, the identity of the requests of the
// batch in flight (within DefaultBudget). Other calls pass untouched.
func UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if BatchMethods[method] {
			if src, ok := ctx.Value(sourceKey{}).(Source); ok {
				if calls := src.BatchLineage(); len(calls) > 0 {
					ctx = AppendOutgoing(ctx, calls, DefaultBudget)
				}
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// FromContext returns the identity of the batch in flight of ctx's Source
// (nil without one): for callers that are not gRPC (Clipper's REST).
func FromContext(ctx context.Context) []*hamsv1.CallLineage {
	if src, ok := ctx.Value(sourceKey{}).(Source); ok {
		return src.BatchLineage()
	}
	return nil
}

// pairs returns the key/value pairs for calls within budget bytes of
// values: value encodes a serialized lineage, and the budget counts its
// base64 size (what travels).
func pairs(calls []*hamsv1.CallLineage, budget int, value func(b []byte) string) []string {
	kv := make([]string, 0, 4*len(calls)+2)
	used, listed := 0, 0
	for _, c := range calls {
		id := strconv.FormatUint(c.GetReqId(), 10)
		if used+len(id) > budget {
			break
		}
		used += len(id)
		kv = append(kv, KeyReqID, id)
		listed++
	}
	if listed == len(calls) {
		// Lineages in order while they fit (a prefix, so value i is the
		// lineage of request i).
		lin := make([]string, 0, 2*len(calls))
		for _, c := range calls {
			b, err := proto.Marshal(c)
			if err != nil {
				break
			}
			n := base64.RawStdEncoding.EncodedLen(len(b))
			if used+n > budget {
				break
			}
			used += n
			lin = append(lin, KeyLineage, value(b))
		}
		kv = append(kv, lin...)
		if n := len(lin) / 2; n < len(calls) {
			kv = append(kv, KeyTruncated, strconv.Itoa(len(calls)-n))
		}
		return kv
	}
	return append(kv, KeyTruncated, strconv.Itoa(len(calls)-listed))
}

// AppendOutgoing adds the identity of calls (one per request, in order) to
// ctx's outgoing gRPC metadata, keeping the values under budget bytes
// (base64 of binary values counted).
func AppendOutgoing(ctx context.Context, calls []*hamsv1.CallLineage, budget int) context.Context {
	if len(calls) == 0 {
		return ctx
	}
	// gRPC base64-encodes binary values itself: hand it the raw bytes.
	return metadata.AppendToOutgoingContext(ctx, pairs(calls, budget, func(b []byte) string { return string(b) })...)
}

// SetHeaders sets the identity of calls as HTTP headers (lineage values
// base64, standard alphabet, no padding), within budget bytes.
func SetHeaders(h http.Header, calls []*hamsv1.CallLineage, budget int) {
	kv := pairs(calls, budget, base64.RawStdEncoding.EncodeToString)
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
}

// Call is the identity decoded from one call's metadata.
type Call struct {
	// ReqIDs of the requests the call carries, in row order.
	ReqIDs []uint64
	// Lineages, one per request (a prefix of them when Truncated > 0).
	Lineages []*hamsv1.CallLineage
	// Truncated is the number of requests the metadata does not list.
	Truncated int
}

// FromIncoming decodes the identity a server received (nil, nil when the
// call carries none).
func FromIncoming(ctx context.Context) (*Call, error) {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return nil, nil
	}
	return FromMD(md)
}

// FromMD decodes the identity in md (nil, nil when it carries none).
func FromMD(md metadata.MD) (*Call, error) {
	ids, lins, tr := md.Get(KeyReqID), md.Get(KeyLineage), md.Get(KeyTruncated)
	if len(ids) == 0 && len(lins) == 0 && len(tr) == 0 {
		return nil, nil
	}
	return decode(ids, lins, tr, func(s string) ([]byte, error) { return []byte(s), nil })
}

// FromHeaders decodes the identity in HTTP headers (nil, nil when none).
func FromHeaders(h http.Header) (*Call, error) {
	ids, lins, tr := h.Values(KeyReqID), h.Values(KeyLineage), h.Values(KeyTruncated)
	if len(ids) == 0 && len(lins) == 0 && len(tr) == 0 {
		return nil, nil
	}
	return decode(ids, lins, tr, func(s string) ([]byte, error) {
		return base64.RawStdEncoding.DecodeString(strings.TrimRight(s, "="))
	})
}

func decode(ids, lins, tr []string, raw func(string) ([]byte, error)) (*Call, error) {
	c := &Call{}
	for _, s := range ids {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("hamsmd: %s %q: %w", KeyReqID, s, err)
		}
		c.ReqIDs = append(c.ReqIDs, v)
	}
	for i, s := range lins {
		b, err := raw(s)
		if err != nil {
			return nil, fmt.Errorf("hamsmd: %s value %d: %w", KeyLineage, i, err)
		}
		cl := &hamsv1.CallLineage{}
		if err := proto.Unmarshal(b, cl); err != nil {
			return nil, fmt.Errorf("hamsmd: %s value %d: %w", KeyLineage, i, err)
		}
		c.Lineages = append(c.Lineages, cl)
	}
	if len(tr) > 0 {
		n, err := strconv.Atoi(tr[0])
		if err != nil || n < 0 {
			return nil, fmt.Errorf("hamsmd: %s %q is not a count", KeyTruncated, tr[0])
		}
		c.Truncated = n
	}
	return c, nil
}

// Lineage converts lineage entries for a CallLineage: output digests are
// left out (they matter to HAMS's checker, not to correlation, and are
// 64 bytes each).
func Lineage(entries []*hamsv1.LineageEntry) []*hamsv1.LineageEntry {
	if len(entries) == 0 {
		return nil
	}
	slab := make([]hamsv1.LineageEntry, len(entries))
	out := make([]*hamsv1.LineageEntry, len(entries))
	for i, e := range entries {
		slab[i].PredModel, slab[i].PredSeq, slab[i].Model, slab[i].Seq = e.GetPredModel(), e.GetPredSeq(), e.GetModel(), e.GetSeq()
		out[i] = &slab[i]
	}
	return out
}

// Forwardable returns the client metadata a pass-through call forwards to
// the backend: everything but HTTP/2 pseudo-headers, gRPC's reserved
// headers and the hams- keys.
func Forwardable(md metadata.MD) metadata.MD {
	out := make(metadata.MD, len(md))
	for k, v := range md {
		if reserved(k) {
			continue
		}
		out[k] = v
	}
	return out
}

func reserved(k string) bool {
	switch k {
	case "content-type", "user-agent", "te", "connection", "host":
		return true
	}
	return strings.HasPrefix(k, ":") || strings.HasPrefix(k, "grpc-") || strings.HasPrefix(k, Prefix)
}
