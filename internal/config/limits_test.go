package config

import (
	"errors"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

func TestLimitsDefaults(t *testing.T) {
	d, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	l := d.Limits
	if l.MaxRowsPerRequest != DefaultMaxRowsPerRequest || l.MaxInflightRequests != DefaultMaxInflightRequests ||
		l.MaxInflightBytes != DefaultInflightMessages*int64(l.MaxMessageBytes) || l.MaxDecodedBytes() != l.MaxMessageBytes {
		t.Fatalf("limits defaults: %+v", l)
	}
	// The effective file round-trips (children read it).
	b, err := yaml.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := Parse(b)
	if err != nil {
		t.Fatalf("re-parse: %v\n%s", err, b)
	}
	if d2.Limits != d.Limits {
		t.Fatalf("limits after a round trip: %+v, want %+v", d2.Limits, d.Limits)
	}
	for _, c := range []struct{ yaml, want string }{
		{"limits: {max_rows_per_request: -1}", "max_rows_per_request -1"},
		{"limits: {max_inflight_requests: -2}", "max_inflight_requests -2"},
		{"limits: {max_inflight_bytes: -3}", "max_inflight_bytes -3"},
		{"limits: {request_timeout: -1s}", "request_timeout -1s"},
	} {
		_, err := Parse([]byte(good + c.yaml + "\n"))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error naming %q", c.yaml, err, c.want)
		}
	}
}

func TestRejectNonFinite(t *testing.T) {
	const dep = `
name: t
hosts: [h1, h2]
limits: {%s}
models:
  - {name: a, kind: prep%s}
  - {name: b, kind: lstm, stateful: true, placement: {primary: h1, backup: h2}%s}
  - {name: c, kind: prep}
services:
  - {name: st, edges: [[frontend, a], [a, b], [b, frontend]]}
  - {name: sl, edges: [[frontend, c], [c, frontend]]}
`
	for _, c := range []struct {
		limits, a, b string
		st, sl       bool
	}{
		{"", "", "", true, false},                                                    // default: services with a stateful model
		{"reject_non_finite: false", "", "", false, false},                           // off everywhere
		{"reject_non_finite: true", "", "", true, true},                              // on everywhere
		{"", "", ", reject_non_finite: false", false, false},                         // the stateful model opts out
		{"", ", reject_non_finite: true", ", reject_non_finite: false", true, false}, // any model of the service asking wins
		{"reject_non_finite: true", ", reject_non_finite: false", "", false, true},   // a model's setting beats limits'
	} {
		y := strings.Replace(dep, "limits: {%s}", "limits: {"+c.limits+"}", 1)
		y = strings.Replace(y, "kind: prep%s}", "kind: prep"+c.a+"}", 1)
		y = strings.Replace(y, "backup: h2}%s}", "backup: h2}"+c.b+"}", 1)
		d, err := Parse([]byte(y))
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if got := d.RejectNonFinite("st"); got != c.st {
			t.Errorf("%+v: service st rejects non-finite %v, want %v", c, got, c.st)
		}
		if got := d.RejectNonFinite("sl"); got != c.sl {
			t.Errorf("%+v: service sl rejects non-finite %v, want %v", c, got, c.sl)
		}
	}
	if (&Deployment{}).RejectNonFinite("nope") {
		t.Error("unknown service rejects non-finite")
	}
}
