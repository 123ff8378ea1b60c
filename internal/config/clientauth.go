package config

import (
	"encoding/hex"
	"fmt"
)

// ClientAuth is the deployment's client_auth block: how the frontend's
// client ports (gRPC: the HAMS API, TF Serving, KServe v2, the raw
// pass-through; HTTP/JSON) authenticate and authorize clients. Without
// the block the client ports are plaintext and open (the internal ports
// are protected regardless). With it:
//
//   - tls serves the client gRPC and HTTP listeners over TLS; with
//     client_ca_file, every client must present a certificate that CA
//     signed (the TLS handshake refuses the others).
//   - tokens lists bearer tokens (gRPC metadata "authorization: Bearer
//     <token>", HTTP header "Authorization: Bearer <token>"), each with
//     the models and services it may call.
//   - certificates lists client-certificate identities (a URI SAN or the
//     Subject CN of a certificate client_ca_file verified), each with the
//     models and services it may call.
//
// A client is authenticated when any listed token or certificate matches
// (a presented token is checked first: a wrong one is refused even with a
// good certificate); when neither tokens nor certificates are listed, TLS
// alone decides (every verified client certificate, or every client
// without client_ca_file, may call every model). Health and metrics stay
// open.
type ClientAuth struct {
	TLS          *ClientTLS   `yaml:"tls,omitempty"`
	Tokens       []ClientCred `yaml:"tokens,omitempty"`
	Certificates []ClientCert `yaml:"certificates,omitempty"`
}

// ClientTLS is the client ports' TLS (PEM files, reloaded when they
// change; relative paths are relative to the working directory of the
// frontend's process).
type ClientTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile, when set, requires a client certificate signed by one
	// of its CAs.
	ClientCAFile string `yaml:"client_ca_file,omitempty"`
}

// ClientCred is one bearer token: the token itself in TokenFile (its
// content, surrounding white space trimmed), or the hex SHA-256 digest of
// the token in SHA256. Models are the model and service names it may
// call ("*": every one).
type ClientCred struct {
	Name      string   `yaml:"name"`
	TokenFile string   `yaml:"token_file,omitempty"`
	SHA256    string   `yaml:"sha256,omitempty"`
	Models    []string `yaml:"models"`
}

// ClientCert is one client-certificate identity: a URI SAN (e.g. a
// SPIFFE id) or a Subject common name; Models as in ClientCred.
type ClientCert struct {
	Name       string   `yaml:"name"`
	URI        string   `yaml:"uri,omitempty"`
	CommonName string   `yaml:"common_name,omitempty"`
	Models     []string `yaml:"models"`
}

// AllModels in a models list allows every model and service.
const AllModels = "*"

// validate checks the block; every error names the field at fault.
func (c *ClientAuth) validate(d *Deployment) []error {
	if c == nil {
		return nil
	}
	var errs []error
	if c.TLS != nil {
		if c.TLS.CertFile == "" {
			errs = append(errs, invalid("client_auth.tls.cert_file: missing (the client ports' certificate)"))
		}
		if c.TLS.KeyFile == "" {
			errs = append(errs, invalid("client_auth.tls.key_file: missing (the key of cert_file)"))
		}
	}
	if c.TLS == nil && len(c.Tokens) == 0 && len(c.Certificates) == 0 {
		errs = append(errs, invalid("client_auth: empty (give tls, tokens or certificates, or leave the block out for open client ports)"))
	}
	if len(c.Certificates) > 0 && (c.TLS == nil || c.TLS.ClientCAFile == "") {
		errs = append(errs, invalid("client_auth.certificates: needs client_auth.tls.client_ca_file (only verified certificates identify a client)"))
	}
	names := map[string]string{}
	seen := func(where, name string) {
		if name == "" {
			errs = append(errs, invalid("%s.name: missing", where))
			return
		}
		if prev, dup := names[name]; dup {
			errs = append(errs, invalid("%s.name: %q is also %s", where, name, prev))
			return
		}
		names[name] = where
	}
	for i, t := range c.Tokens {
		where := fmt.Sprintf("client_auth.tokens[%d]", i)
		seen(where, t.Name)
		switch {
		case t.TokenFile == "" && t.SHA256 == "":
			errs = append(errs, invalid("%s: give token_file or sha256", where))
		case t.TokenFile != "" && t.SHA256 != "":
			errs = append(errs, invalid("%s: give token_file or sha256, not both", where))
		case t.SHA256 != "":
			if b, err := hex.DecodeString(t.SHA256); err != nil || len(b) != 32 {
				errs = append(errs, invalid("%s.sha256: not 64 hex digits (the SHA-256 digest of the token)", where))
			}
		}
		errs = append(errs, d.validateAllowList(where, t.Models)...)
	}
	for i, ct := range c.Certificates {
		where := fmt.Sprintf("client_auth.certificates[%d]", i)
		seen(where, ct.Name)
		switch {
		case ct.URI == "" && ct.CommonName == "":
			errs = append(errs, invalid("%s: give uri or common_name", where))
		case ct.URI != "" && ct.CommonName != "":
			errs = append(errs, invalid("%s: give uri or common_name, not both", where))
		}
		errs = append(errs, d.validateAllowList(where, ct.Models)...)
	}
	return errs
}

// validateAllowList checks that every entry names a service or a model
// of the deployment, or is AllModels.
func (d *Deployment) validateAllowList(where string, models []string) []error {
	if len(models) == 0 {
		return []error{invalid("%s.models: empty (list the models or services it may call, or %q)", where, AllModels)}
	}
	var errs []error
	for j, m := range models {
		if m == AllModels {
			continue
		}
		if d.Model(m) == nil && d.Service(m) == nil {
			errs = append(errs, invalid("%s.models[%d]: %q is neither a model nor a service of the deployment", where, j, m))
		}
	}
	return errs
}
