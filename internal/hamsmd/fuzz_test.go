package hamsmd

import (
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// FuzzLineageMetadata decodes request identity metadata a peer sent (a
// backend or proxy receives it from HAMS, HAMS from whoever calls it),
// as gRPC metadata and as HTTP headers: no panic; an error names the key
// ("hamsmd: <key> ..."); lineages decoded encode back (AppendOutgoing's
// pairs, SetHeaders) to metadata that decodes to the same lineages
// (decode(encode(x)) == x).
func FuzzLineageMetadata(f *testing.F) {
	cl := &hamsv1.CallLineage{ReqId: 7, Service: "s", StreamId: "st", Model: "m",
		Lineage: []*hamsv1.LineageEntry{{PredModel: "frontend", PredSeq: 7, Model: "a", Seq: 3}}}
	b, _ := proto.Marshal(cl)
	f.Add("7", b, "", "")
	f.Add("7,8", b, "1", "bad=base64")
	f.Add("x", []byte{0x0a, 0x7f}, "-1", "")
	f.Fuzz(func(t *testing.T, ids string, lin []byte, truncated, header string) {
		md := metadata.MD{}
		for _, id := range strings.Split(ids, ",") {
			if id != "" {
				md.Append(KeyReqID, id)
			}
		}
		if len(lin) > 0 {
			md.Append(KeyLineage, string(lin))
		}
		if truncated != "" {
			md.Append(KeyTruncated, truncated)
		}
		check := func(what string, c *Call, err error) {
			t.Helper()
			if err != nil {
				if !strings.HasPrefix(err.Error(), "hamsmd: "+KeyReqID) && !strings.HasPrefix(err.Error(), "hamsmd: "+KeyLineage) &&
					!strings.HasPrefix(err.Error(), "hamsmd: "+KeyTruncated) {
					t.Fatalf("%s: error %q names no key", what, err)
				}
				return
			}
			if c == nil || len(c.Lineages) == 0 {
				return
			}
			if c.Truncated < 0 {
				t.Fatalf("%s: truncated %d", what, c.Truncated)
			}
			// decode(encode(x)) == x, through both encodings.
			h := http.Header{}
			SetHeaders(h, c.Lineages, 1<<20)
			back, err := FromHeaders(h)
			same(t, what+" via headers", back, err, c.Lineages)
			kv := pairs(c.Lineages, 1<<20, func(b []byte) string { return string(b) })
			back, err = FromMD(metadata.Pairs(kv...))
			same(t, what+" via metadata", back, err, c.Lineages)
		}
		c, err := FromMD(md)
		check("FromMD", c, err)
		h := http.Header{}
		for k, vs := range md {
			for _, v := range vs {
				h.Add(k, v)
			}
		}
		if header != "" {
			h.Add(KeyLineage, header)
		}
		c, err = FromHeaders(h)
		check("FromHeaders", c, err)
	})
}

func same(t *testing.T, what string, got *Call, err error, want []*hamsv1.CallLineage) {
	t.Helper()
	if err != nil || got == nil || len(got.Lineages) != len(want) || len(got.ReqIDs) != len(want) || got.Truncated != 0 {
		t.Fatalf("%s: %+v %v, want %d lineages", what, got, err, len(want))
	}
	for i := range want {
		if !proto.Equal(got.Lineages[i], want[i]) || got.ReqIDs[i] != want[i].GetReqId() {
			t.Fatalf("%s: lineage %d = %v, want %v", what, i, got.Lineages[i], want[i])
		}
	}
}
