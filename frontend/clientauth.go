package frontend

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// Client authentication (the deployment's client_auth block,
// config.ClientAuth). ClientAuth holds the credentials: the client ports'
// TLS (its key pair reloaded when the files change), the bearer tokens
// (their SHA-256 digests only) and the client-certificate identities,
// each with the models and services it may call. The frontend enforces
// them on every client API: the gRPC client server's interceptors
// authenticate every call (Unauthenticated) and authorize the model a
// typed request names (PermissionDenied); the raw pass-through
// (passraw.go) authorizes the model its first message names; the HTTP
// API answers 401 (with WWW-Authenticate: Bearer) and 403. Liveness and
// readiness (KServe ServerLive and ServerReady, HTTP /healthz) and
// /metrics stay open. Tokens are never logged, and never forwarded to a
// pass-through backend.

// authHeader is the metadata key (and, canonicalized, the HTTP header)
// carrying a bearer token.
const authHeader = "authorization"

// certCheckEvery bounds how often the key pair's files are looked at.
const certCheckEvery = time.Second

// clientGate is what the frontend needs of client authentication
// (implemented by *ClientAuth).
type clientGate interface {
	// identify authenticates a gRPC call (its peer's verified certificate
	// and its authorization metadata).
	identify(ctx context.Context) (*principal, error)
	// identifyHTTP authenticates an HTTP request.
	identifyHTTP(r *http.Request) (*principal, error)
	// serverTLS is the client ports' TLS configuration (nil: plaintext).
	serverTLS() *tls.Config
	// bearer says whether tokens are checked (the authorization metadata
	// is then the frontend's, not forwarded to pass-through backends).
	bearer() bool
}

// principal is an authenticated client: its name in the configuration
// (never its token) and what it may call.
type principal struct {
	name  string
	all   bool
	names map[string]bool
}

func newPrincipal(name string, models []string) *principal {
	p := &principal{name: name, names: map[string]bool{}}
	for _, m := range models {
		if m == config.AllModels {
			p.all = true
		}
		p.names[m] = true
	}
	return p
}

// anyone is the principal of a deployment whose client_auth lists neither
// tokens nor certificates: TLS alone decides.
var anyone = &principal{name: "tls", all: true}

type tokenEntry struct {
	digest [sha256.Size]byte
	p      *principal
}

type certEntry struct {
	uri, cn string
	p       *principal
}

// ClientAuth authenticates and authorizes the clients of a frontend's
// client ports (Config.ClientAuth).
type ClientAuth struct {
	tokens []tokenEntry
	certs  []certEntry
	// required: tokens or certificates are listed, so a call must match
	// one of them.
	required bool
	tls      *tls.Config
	keys     *keyPair
}

// NewClientAuth builds the client authentication of c: it reads the token
// files, the key pair and the client CA (so a bad file fails at start).
func NewClientAuth(c *config.ClientAuth, log *slog.Logger) (*ClientAuth, error) {
	if c == nil {
		return nil, errors.New("frontend: client auth: no client_auth block")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &ClientAuth{required: len(c.Tokens) > 0 || len(c.Certificates) > 0}
	for i, t := range c.Tokens {
		e := tokenEntry{p: newPrincipal(t.Name, t.Models)}
		switch {
		case t.TokenFile != "":
			b, err := os.ReadFile(t.TokenFile)
			if err != nil {
				return nil, fmt.Errorf("frontend: client_auth.tokens[%d] (%s): read token_file: %w", i, t.Name, err)
			}
			tok := strings.TrimSpace(string(b))
			if tok == "" {
				return nil, fmt.Errorf("frontend: client_auth.tokens[%d] (%s): token_file %s is empty", i, t.Name, t.TokenFile)
			}
			e.digest = sha256.Sum256([]byte(tok))
		default:
			b, err := hex.DecodeString(t.SHA256)
			if err != nil || len(b) != sha256.Size {
				return nil, fmt.Errorf("frontend: client_auth.tokens[%d] (%s): sha256 is not 64 hex digits", i, t.Name)
			}
			copy(e.digest[:], b)
		}
		a.tokens = append(a.tokens, e)
	}
	for _, ct := range c.Certificates {
		a.certs = append(a.certs, certEntry{uri: ct.URI, cn: ct.CommonName, p: newPrincipal(ct.Name, ct.Models)})
	}
	if c.TLS != nil {
		a.keys = &keyPair{certFile: c.TLS.CertFile, keyFile: c.TLS.KeyFile, now: time.Now, log: log.With("component", "frontend client TLS")}
		if err := a.keys.load(); err != nil {
			return nil, fmt.Errorf("frontend: client_auth.tls: %w", err)
		}
		a.tls = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: a.keys.get}
		if c.TLS.ClientCAFile != "" {
			pem, err := os.ReadFile(c.TLS.ClientCAFile)
			if err != nil {
				return nil, fmt.Errorf("frontend: client_auth.tls: read client_ca_file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("frontend: client_auth.tls: client_ca_file %s holds no PEM certificate", c.TLS.ClientCAFile)
			}
			a.tls.ClientCAs = pool
			a.tls.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return a, nil
}

func (a *ClientAuth) serverTLS() *tls.Config { return a.tls }

func (a *ClientAuth) bearer() bool { return len(a.tokens) > 0 }

func (a *ClientAuth) identify(ctx context.Context) (*principal, error) {
	var leaf *x509.Certificate
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			leaf = verifiedLeaf(ti.State)
		}
	}
	var vals []string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		vals = md.Get(authHeader)
	}
	return a.check(vals, leaf)
}

func (a *ClientAuth) identifyHTTP(r *http.Request) (*principal, error) {
	var leaf *x509.Certificate
	if r.TLS != nil {
		leaf = verifiedLeaf(*r.TLS)
	}
	return a.check(r.Header.Values(authHeader), leaf)
}

// verifiedLeaf is the client certificate the handshake verified (nil:
// none, or not verified).
func verifiedLeaf(st tls.ConnectionState) *x509.Certificate {
	if len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return nil
	}
	return st.VerifiedChains[0][0]
}

// errNoCredentials and the other refusals never quote what the client
// sent.
var (
	errNoCredentials = status.Error(codes.Unauthenticated, "client authentication required: send \"authorization: Bearer <token>\" or a client certificate")
	errBadToken      = status.Error(codes.Unauthenticated, "client authentication failed: invalid bearer token")
	errNotBearer     = status.Error(codes.Unauthenticated, "client authentication failed: authorization is not one \"Bearer <token>\"")
)

// check authenticates a call from its authorization values and verified
// client certificate: a presented token must match a listed one (compared
// in constant time on SHA-256 digests); else a listed certificate
// identity; else, when nothing is listed, the TLS handshake decided.
func (a *ClientAuth) check(authz []string, leaf *x509.Certificate) (*principal, error) {
	if len(a.tokens) > 0 && len(authz) > 0 {
		if len(authz) != 1 {
			return nil, errNotBearer
		}
		scheme, tok, ok := strings.Cut(strings.TrimSpace(authz[0]), " ")
		tok = strings.TrimSpace(tok)
		if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
			return nil, errNotBearer
		}
		d := sha256.Sum256([]byte(tok))
		var found *principal
		for i := range a.tokens {
			// Every entry is compared: the time taken does not say which
			// one matched.
			if subtle.ConstantTimeCompare(d[:], a.tokens[i].digest[:]) == 1 && found == nil {
				found = a.tokens[i].p
			}
		}
		if found == nil {
			return nil, errBadToken
		}
		return found, nil
	}
	if leaf != nil {
		for _, c := range a.certs {
			if c.matches(leaf) {
				return c.p, nil
			}
		}
	}
	if !a.required {
		return anyone, nil
	}
	return nil, errNoCredentials
}

// matches says whether the certificate carries the entry's identity: one
// of its URI SANs, or its Subject CN.
func (c certEntry) matches(leaf *x509.Certificate) bool {
	if c.uri != "" {
		for _, u := range leaf.URIs {
			if u.String() == c.uri {
				return true
			}
		}
		return false
	}
	return c.cn != "" && leaf.Subject.CommonName == c.cn
}

// keyPair is the client ports' certificate, reloaded when its files
// change: GetCertificate looks at their modification times and sizes at
// most once per certCheckEvery (no goroutine of its own). A pair that
// fails to load keeps the previous one serving.
type keyPair struct {
	certFile, keyFile string
	now               func() time.Time
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   string
	checked time.Time
}

// fileStamps identifies the files' versions.
func (k *keyPair) fileStamps() (string, error) {
	var b strings.Builder
	for _, p := range []string{k.certFile, k.keyFile} {
		st, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("stat %s: %w", p, err)
		}
		fmt.Fprintf(&b, "%d/%d;", st.ModTime().UnixNano(), st.Size())
	}
	return b.String(), nil
}

// load reads the pair (and notes its files' stamps).
func (k *keyPair) load() error {
	stamp, err := k.fileStamps()
	if err != nil {
		return err
	}
	c, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		return fmt.Errorf("load key pair %s, %s: %w", k.certFile, k.keyFile, err)
	}
	k.mu.Lock()
	k.cert, k.stamp, k.checked = &c, stamp, k.now()
	k.mu.Unlock()
	return nil
}

// get is tls.Config.GetCertificate.
func (k *keyPair) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	if now.Sub(k.checked) < certCheckEvery {
		return k.cert, nil
	}
	k.checked = now
	stamp, err := k.fileStamps()
	if err != nil {
		k.log.Warn("client TLS key pair not reloaded; serving the previous one", "err", err)
		return k.cert, nil
	}
	if stamp == k.stamp {
		return k.cert, nil
	}
	c, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		// A pair caught half written loads on a later look.
		k.log.Warn("client TLS key pair not reloaded; serving the previous one", "err", err)
		return k.cert, nil
	}
	k.cert, k.stamp = &c, stamp
	k.log.Info("client TLS key pair reloaded", "cert_file", k.certFile)
	return k.cert, nil
}

// Authorization of the client APIs.

// methodScope says what a client method needs.
type methodScope int

const (
	// scopeModel: an authenticated client allowed the model the request
	// names (the default: a method not listed below must name one).
	scopeModel methodScope = iota
	// scopeClient: any authenticated client (no model in the request).
	scopeClient
	// scopeOpen: anyone (liveness and readiness).
	scopeOpen
)

var methodScopes = map[string]methodScope{
	hamsv1.Frontend_ListServices_FullMethodName:                  scopeClient,
	inference.GRPCInferenceService_ServerMetadata_FullMethodName: scopeClient,
	inference.GRPCInferenceService_ServerLive_FullMethodName:     scopeOpen,
	inference.GRPCInferenceService_ServerReady_FullMethodName:    scopeOpen,
}

// requestModel is the model (or service) name a typed client request
// names.
func requestModel(req any) (string, bool) {
	switch r := req.(type) {
	case *hamsv1.PredictRequest:
		return r.GetService(), true
	case *tfapis.PredictRequest:
		return r.GetModelSpec().GetName(), true
	case *tfapis.GetModelMetadataRequest:
		return r.GetModelSpec().GetName(), true
	case *tfapis.GetModelStatusRequest:
		return r.GetModelSpec().GetName(), true
	case *inference.ModelInferRequest:
		return r.GetModelName(), true
	case *inference.ModelReadyRequest:
		return r.GetName(), true
	case *inference.ModelMetadataRequest:
		return r.GetName(), true
	}
	return "", false
}

// principalKey carries the call's principal in its context.
type principalKey struct{}

// clientAuthOptions are the client server's options of client
// authentication: its TLS credentials and interceptors.
func (f *Frontend) clientAuthOptions() []grpc.ServerOption {
	var opts []grpc.ServerOption
	if t := f.auth.serverTLS(); t != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(t)))
	}
	return append(opts, grpc.ChainUnaryInterceptor(f.authUnary), grpc.ChainStreamInterceptor(f.authStream))
}

func (f *Frontend) authUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	scope := methodScopes[info.FullMethod]
	if scope == scopeOpen {
		return handler(ctx, req)
	}
	p, err := f.auth.identify(ctx)
	if err != nil {
		f.log.Debug("client call refused", "method", info.FullMethod, "err", err)
		return nil, err
	}
	if scope == scopeModel {
		name, ok := requestModel(req)
		if !ok {
			return nil, status.Errorf(codes.PermissionDenied, "%s is not open to authenticated clients", info.FullMethod)
		}
		if err := f.authorize(p, name); err != nil {
			return nil, err
		}
	}
	return handler(context.WithValue(ctx, principalKey{}, p), req)
}

// authStream authenticates a stream at its start; the model is
// authorized by the handler once the first message names it (the raw
// pass-through: proxyUnknown).
func (f *Frontend) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	p, err := f.auth.identify(ss.Context())
	if err != nil {
		f.log.Debug("client call refused", "method", info.FullMethod, "err", err)
		return err
	}
	return handler(srv, &principalStream{ServerStream: ss, ctx: context.WithValue(ss.Context(), principalKey{}, p)})
}

type principalStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *principalStream) Context() context.Context { return s.ctx }

// authorizeCtx authorizes the call of ctx for model name (nothing to do
// without client authentication).
func (f *Frontend) authorizeCtx(ctx context.Context, name string) error {
	if f.auth == nil {
		return nil
	}
	p, _ := ctx.Value(principalKey{}).(*principal)
	if p == nil {
		return status.Error(codes.PermissionDenied, "the call was not authenticated")
	}
	return f.authorize(p, name)
}

// authorize refuses p a model or service it is not allowed: the name the
// client gave, or another name of the same target (a one-model service's
// model and service name are one target).
func (f *Frontend) authorize(p *principal, name string) error {
	if p.all {
		return nil
	}
	for _, n := range f.targetNames(name) {
		if p.names[n] {
			return nil
		}
	}
	f.log.Debug("client call refused", "client", p.name, "model", name)
	return status.Errorf(codes.PermissionDenied, "client %q may not call model %q", p.name, name)
}

// targetNames lists the names of what a client's model name calls.
func (f *Frontend) targetNames(name string) []string {
	if p := f.passFor(name); p != nil {
		return []string{p.model, p.service}
	}
	if s, err := f.modelService(name); err == nil {
		out := []string{s.name}
		if len(s.models) == 1 {
			out = append(out, s.models[0])
		}
		return out
	}
	return []string{name}
}

// httpAuth wraps an HTTP client endpoint: 401 without valid credentials,
// 403 for a model the client may not call (model returns the request's
// model, false for an endpoint naming none).
func (f *Frontend) httpAuth(h http.HandlerFunc, model func(*http.Request) (string, bool)) http.HandlerFunc {
	if f.auth == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := f.auth.identifyHTTP(r)
		if err != nil {
			f.log.Debug("http client refused", "path", r.URL.Path, "err", err)
			w.Header().Set("WWW-Authenticate", `Bearer realm="hams"`)
			writeError(w, err)
			return
		}
		if name, ok := model(r); ok {
			if err := f.authorize(p, name); err != nil {
				writeError(w, err)
				return
			}
		}
		h(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	}
}

// httpListener is the HTTP API's listener, under TLS when the client
// ports have it.
func (f *Frontend) httpListener() net.Listener {
	if f.auth == nil || f.auth.serverTLS() == nil {
		return f.cfg.HTTPListener
	}
	t := f.auth.serverTLS().Clone()
	t.NextProtos = []string{"http/1.1"}
	return tls.NewListener(f.cfg.HTTPListener, t)
}
