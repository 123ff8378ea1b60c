package config

import (
	"errors"
	"strings"
	"testing"
)

const digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

func TestClientAuthParses(t *testing.T) {
	d, err := Parse([]byte(good + `client_auth:
  tls: {cert_file: c.pem, key_file: k.pem, client_ca_file: ca.pem}
  tokens:
    - {name: ops, sha256: ` + digest + `, models: ["*"]}
    - {name: app, token_file: /run/secrets/app, models: [s, a]}
  certificates:
    - {name: batch, uri: "spiffe://clients/batch", models: [s]}
    - {name: legacy, common_name: legacy-client, models: [s]}
`))
	if err != nil {
		t.Fatal(err)
	}
	ca := d.ClientAuth
	if ca == nil || ca.TLS.ClientCAFile != "ca.pem" || len(ca.Tokens) != 2 || ca.Tokens[1].TokenFile != "/run/secrets/app" ||
		len(ca.Certificates) != 2 || ca.Certificates[1].CommonName != "legacy-client" {
		t.Fatalf("client_auth %+v", ca)
	}
	if d, err := Parse([]byte(good)); err != nil || d.ClientAuth != nil {
		t.Fatalf("without the block: %v, %+v", err, d.ClientAuth)
	}
}

// Every error names the field at fault.
func TestClientAuthErrorsNameTheField(t *testing.T) {
	cases := map[string]struct{ block, want string }{
		"empty":             {"client_auth: {}\n", "client_auth: empty"},
		"no cert_file":      {"client_auth: {tls: {key_file: k}}\n", "client_auth.tls.cert_file"},
		"no key_file":       {"client_auth: {tls: {cert_file: c}}\n", "client_auth.tls.key_file"},
		"certs without CA":  {"client_auth: {tls: {cert_file: c, key_file: k}, certificates: [{name: x, uri: 'spiffe://x', models: [s]}]}\n", "client_auth.certificates: needs client_auth.tls.client_ca_file"},
		"token no name":     {"client_auth: {tokens: [{sha256: " + digest + ", models: [s]}]}\n", "client_auth.tokens[0].name"},
		"token twice":       {"client_auth: {tokens: [{name: x, sha256: " + digest + ", models: [s]}, {name: x, token_file: f, models: [s]}]}\n", `client_auth.tokens[1].name: "x" is also client_auth.tokens[0]`},
		"token no secret":   {"client_auth: {tokens: [{name: x, models: [s]}]}\n", "client_auth.tokens[0]: give token_file or sha256"},
		"token both":        {"client_auth: {tokens: [{name: x, token_file: f, sha256: " + digest + ", models: [s]}]}\n", "not both"},
		"bad digest":        {"client_auth: {tokens: [{name: x, sha256: abc, models: [s]}]}\n", "client_auth.tokens[0].sha256"},
		"no models":         {"client_auth: {tokens: [{name: x, token_file: f}]}\n", "client_auth.tokens[0].models: empty"},
		"unknown model":     {"client_auth: {tokens: [{name: x, token_file: f, models: [s, nope]}]}\n", `client_auth.tokens[0].models[1]: "nope"`},
		"cert no identity":  {"client_auth: {tls: {cert_file: c, key_file: k, client_ca_file: ca}, certificates: [{name: x, models: [s]}]}\n", "client_auth.certificates[0]: give uri or common_name"},
		"cert both":         {"client_auth: {tls: {cert_file: c, key_file: k, client_ca_file: ca}, certificates: [{name: x, uri: 'u:x', common_name: x, models: [s]}]}\n", "client_auth.certificates[0]: give uri or common_name, not both"},
		"cert unknown":      {"client_auth: {tls: {cert_file: c, key_file: k, client_ca_file: ca}, certificates: [{name: x, uri: 'u:x', models: [zz]}]}\n", `client_auth.certificates[0].models[0]: "zz"`},
		"name across lists": {"client_auth: {tls: {cert_file: c, key_file: k, client_ca_file: ca}, tokens: [{name: x, token_file: f, models: [s]}], certificates: [{name: x, uri: 'u:x', models: [s]}]}\n", `client_auth.certificates[0].name: "x" is also client_auth.tokens[0]`},
		"unknown field":     {"client_auth: {tokens: [{name: x, token: plain, models: [s]}]}\n", "token"},
	}
	for name, c := range cases {
		_, err := Parse([]byte(good + c.block))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, c.want)
		}
	}
}
