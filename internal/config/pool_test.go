package config

import (
	"errors"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const poolBase = `
name: p
models:
  - name: m
    kind: classifier
%s
services:
  - name: m
    inputs:
      - {name: images, datatype: FP32, shape: [-1, 784]}
    edges: [[frontend, m], [m, frontend]]
`

func poolDoc(model string) []byte {
	return []byte(strings.Replace(poolBase, "%s", model, 1))
}

func TestPoolConfigValid(t *testing.T) {
	d, err := Parse(poolDoc(`    replicas: 4
    parity: {k: 2, backends: 2}`))
	if err != nil {
		t.Fatal(err)
	}
	m := d.Model("m")
	if !m.Pooled() || m.Redundancy != RedundancyParM || m.Parity.R != 1 || m.Parity.Encoder != "sum" ||
		m.Parity.Decode != DecodeFirstK || m.Parity.Model != "m-parity" || m.ParitySlots() != 2 {
		t.Fatalf("defaults: %+v %+v", m, m.Parity)
	}
	d, err = Parse(poolDoc(`    replicas: [127.0.0.1:1, 127.0.0.1:2, 127.0.0.1:3]
    redundancy: hedge
    hedge_after: 5ms
    parity: {k: 3}`))
	if err != nil {
		t.Fatal(err)
	}
	if m := d.Model("m"); m.Replicas.N() != 3 || m.Replicas.Managed() || m.Parity.Backends.Count != 1 {
		t.Fatalf("addresses: %+v", m.Replicas)
	}
	// The effective file round-trips (children re-parse it).
	b, err := yaml.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := Parse(b)
	if err != nil {
		t.Fatalf("round trip: %v\n%s", err, b)
	}
	if got := d2.Model("m").Replicas.Addresses; len(got) != 3 || got[2] != "127.0.0.1:3" {
		t.Fatalf("round trip replicas %v", got)
	}
	d, err = Parse(poolDoc(`    replicas: 4
    parity: {k: 4, encoder: concat, image: [28, 28, 1]}`))
	if err != nil {
		t.Fatal(err)
	}
}

// Every bad pool config is refused with an error naming the problem.
func TestPoolConfigInvalid(t *testing.T) {
	for _, c := range []struct{ model, want string }{
		{"    replicas: 4\n    parity: {k: 2}\n    stateful: true\n    ha: stateless", "stateless models"},
		{"    replicas: 4\n    parity: {k: 1}", "parity.k 1"},
		{"    replicas: 4\n    parity: {k: 2, r: 0, backends: 1}\n", ""},
		{"    replicas: 4\n    parity: {k: 2, r: 5}", "parity.r 5"},
		{"    replicas: 4\n    parity: {k: 2, r: 2, backends: 1}", "1 parity backends for r = 2"},
		{"    replicas: 4\n    parity: {k: 2, encoder: concat}", "encoder concat is for images"},
		{"    replicas: 4\n    parity: {k: 2, encoder: concat, image: [10, 10, 1]}", "not an image of [10 10 1]"},
		{"    replicas: 4\n    parity: {k: 2, encoder: xor}", `parity.encoder "xor"`},
		{"    replicas: []\n    parity: {k: 2}", "empty list of instances"},
		{"    replicas: 0", "0 instances"},
		{"    replicas: [nohost]", `replicas[0] "nohost" is not host:port`},
		{"    replicas: 4\n    redundancy: parm", "needs a parity block"},
		{"    replicas: 4\n    redundancy: raid", `redundancy "raid"`},
		{"    parity: {k: 2}", "need replicas"},
		{"    replicas: 4\n    hedge_after: 3ms", "hedge_after is for redundancy hedge"},
		{"    replicas: [127.0.0.1:1]\n    straggle: {replicas: [0], spec: seed=1}", "servers the deployment starts"},
		{"    replicas: 2\n    straggle: {replicas: [2], spec: seed=1}", "names replica 2 of 2"},
		{"    replicas: 4\n    parity: {k: 2, decode: last}", `parity.decode "last"`},
	} {
		_, err := Parse(poolDoc(c.model))
		if c.want == "" {
			// r: 0 means the default (1): valid.
			if err != nil {
				t.Errorf("%q: %v", c.model, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q:\n got %v\nwant an error naming %q", c.model, err, c.want)
		} else if !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: %v does not wrap ErrInvalid", c.model, err)
		}
	}
}

func TestPoolConfigOnlineTraining(t *testing.T) {
	d, err := Parse(poolDoc(`    replicas: 4
    parity: {k: 2, train: online, online: {buffer: 1000, every: 10s, epochs: 1, workers: 1, min_agreement: 0.6}}`))
	if err != nil {
		t.Fatal(err)
	}
	if o := d.Model("m").Parity.Online; o.Buffer != 1000 || o.Every.D().Seconds() != 10 || o.MinAgreement != 0.6 {
		t.Fatalf("online %+v", o)
	}
	for _, c := range []struct{ model, want string }{
		{"    replicas: 4\n    parity: {k: 2, train: offline}", `parity.train "offline"`},
		{"    replicas: 4\n    parity: {k: 2, online: {epochs: 1}}", "needs parity.train: online"},
		{"    replicas: 4\n    parity: {k: 2, train: online, online: {min_agreement: 2}}", "min_agreement outside 0..1"},
		{"    replicas: [127.0.0.1:1]\n    backend: {type: tfserving}\n    parity: {k: 2, train: online}", "backend type reference, not tfserving"},
	} {
		_, err := Parse(poolDoc(c.model))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q:\n got %v\nwant an error naming %q", c.model, err, c.want)
		}
	}
}
