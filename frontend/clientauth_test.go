package frontend

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/testing/backendtest"
	"github.com/hams-go/hams/internal/testing/logbuf"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// The tokens of the tests: alice may call echo, tfm and kss (ksm's
// service); bob only gones; wrong is no one's.
const (
	aliceToken = "alice-s3cret-token-value"
	bobToken   = "bob-s3cret-token-value"
	wrongToken = "wrong-s3cret-token-value"
)

// passYAMLFor starts a pass-through backend and returns passYAML for it.
func passYAMLFor(t *testing.T) (string, *backendtest.Server) {
	t.Helper()
	bt, err := backendtest.Start("tf_model", "ks_model")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bt.Stop)
	l := listen(t)
	dead := l.Addr().String()
	l.Close()
	return fmt.Sprintf(passYAML, bt.Addr(), dead), bt
}

// authBlock is a client_auth block for passYAML: alice by digest, bob
// from a token file.
func authBlock(t *testing.T) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "bob.token")
	if err := os.WriteFile(file, []byte("  "+bobToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(aliceToken))
	return fmt.Sprintf(`client_auth:
  tokens:
    - {name: alice, sha256: %s, models: [echo, tfm, kss]}
    - {name: bob, token_file: %q, models: [gones]}
`, hex.EncodeToString(sum[:]), file)
}

// withClientAuth builds Config.ClientAuth from the deployment (and logs
// into log when given).
func withClientAuth(t *testing.T, log *slog.Logger) func(*Config) {
	return func(c *Config) {
		if log != nil {
			c.Logger = log
		}
		a, err := NewClientAuth(c.Deployment.ClientAuth, c.Logger)
		if err != nil {
			t.Fatalf("NewClientAuth: %v", err)
		}
		c.ClientAuth = a
	}
}

// authCall is one client API call, made with ctx's metadata.
type authCall struct {
	name string
	// scoped: the call names a model (bob is refused it); else any
	// authenticated client may make it.
	scoped bool
	call   func(ctx context.Context) error
}

func withToken(ctx context.Context, tok string) context.Context {
	if tok == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

// TestClientAuthTokensEveryAPI: with tokens configured, every client API
// (own gRPC API, TF Serving, KServe v2, the raw pass-through, HTTP/JSON)
// refuses a call without a token and with a wrong one (Unauthenticated,
// HTTP 401 with WWW-Authenticate: Bearer), refuses a model outside the
// token's allow list (PermissionDenied, 403) and accepts the right one;
// liveness, readiness, /healthz and /metrics stay open; the token is not
// forwarded to a pass-through backend and never appears in the logs.
func TestClientAuthTokensEveryAPI(t *testing.T) {
	logs := &logbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	yaml, bt := passYAMLFor(t)
	bt.SetRaw(func(string, []byte) []byte { return nil })
	e := newEnvWith(t, envOpts{yaml: yaml + authBlock(t), config: withClientAuth(t, log)})
	cc, err := grpcx.Dial(e.grpcAddr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	fe, tf, ms, ks := hamsv1.NewFrontendClient(cc), tfapis.NewPredictionServiceClient(cc), tfapis.NewModelServiceClient(cc), inference.NewGRPCInferenceServiceClient(cc)
	x := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: &tfpb.TensorShapeProto{Dim: []*tfpb.TensorShapeProto_Dim{{Size: 1}, {Size: 2}}}, FloatVal: []float32{1, 2}}
	echoTF := map[string]*tfpb.TensorProto{}
	for _, in := range echoInputs(1, 1) {
		tp, err := wire.ToTensorProto(in)
		if err != nil {
			t.Fatal(err)
		}
		echoTF[in.GetName()] = tp
	}
	calls := []authCall{
		{"Frontend.Predict", true, func(ctx context.Context) error {
			_, err := fe.Predict(ctx, &hamsv1.PredictRequest{Service: "echo", Inputs: echoInputs(1, 1)})
			return err
		}},
		{"Frontend.ListServices", false, func(ctx context.Context) error {
			_, err := fe.ListServices(ctx, &hamsv1.ListServicesRequest{})
			return err
		}},
		{"TF Predict (HAMS path)", true, func(ctx context.Context) error {
			_, err := tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: tfSpec("echo"), Inputs: echoTF})
			return err
		}},
		{"TF Predict (pass-through)", true, func(ctx context.Context) error {
			_, err := tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: tfSpec("tfm"), Inputs: map[string]*tfpb.TensorProto{"x": x}})
			return err
		}},
		{"TF GetModelMetadata", true, func(ctx context.Context) error {
			_, err := tf.GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{ModelSpec: tfSpec("echo"), MetadataField: []string{"signature_def"}})
			return err
		}},
		{"TF GetModelStatus", true, func(ctx context.Context) error {
			_, err := ms.GetModelStatus(ctx, &tfapis.GetModelStatusRequest{ModelSpec: tfSpec("tfs")})
			return err
		}},
		{"KServe ModelInfer", true, func(ctx context.Context) error {
			in := echoInputs(1, 1)
			req := &inference.ModelInferRequest{ModelName: "ksm"}
			for _, t := range in {
				req.Inputs = append(req.Inputs, wire.InferInput(t))
				req.RawInputContents = append(req.RawInputContents, t.GetData())
			}
			_, err := ks.ModelInfer(ctx, req)
			return err
		}},
		{"KServe ModelReady", true, func(ctx context.Context) error {
			_, err := ks.ModelReady(ctx, &inference.ModelReadyRequest{Name: "echo"})
			return err
		}},
		{"KServe ModelMetadata", true, func(ctx context.Context) error {
			_, err := ks.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "kss"})
			return err
		}},
		{"KServe ServerMetadata", false, func(ctx context.Context) error {
			_, err := ks.ServerMetadata(ctx, &inference.ServerMetadataRequest{})
			return err
		}},
		{"raw Classify", true, func(ctx context.Context) error {
			return cc.Invoke(ctx, "/tensorflow.serving.PredictionService/Classify", rawOf(pbMsg(nil, 1, pbStr(nil, 1, "tfm"))), &emptypb.Empty{})
		}},
		{"raw ModelConfig", true, func(ctx context.Context) error {
			return cc.Invoke(ctx, "/inference.GRPCInferenceService/ModelConfig", rawOf(pbStr(nil, 1, "ksm")), &emptypb.Empty{})
		}},
	}
	ctx := ctxT(t, 60*time.Second)
	for _, c := range calls {
		for _, tc := range []struct {
			who  string
			tok  string
			want codes.Code
		}{{"no token", "", codes.Unauthenticated}, {"wrong token", wrongToken, codes.Unauthenticated}} {
			if err := c.call(withToken(ctx, tc.tok)); status.Code(err) != tc.want {
				t.Errorf("%s, %s: %v, want %v", c.name, tc.who, err, tc.want)
			}
		}
		err := c.call(withToken(ctx, bobToken))
		if c.scoped && status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s, bob (model not allowed): %v, want PermissionDenied", c.name, err)
		}
		if !c.scoped && err != nil {
			t.Errorf("%s, bob: %v, want accepted", c.name, err)
		}
		if err := c.call(withToken(ctx, aliceToken)); err != nil {
			t.Errorf("%s, alice: %v, want accepted", c.name, err)
		}
	}
	// Another scheme, or two tokens, is no token.
	for _, v := range [][]string{{"authorization", "Basic " + aliceToken}, {"authorization", "Bearer " + aliceToken, "authorization", "Bearer " + aliceToken}} {
		if _, err := fe.ListServices(metadata.AppendToOutgoingContext(ctx, v...), &hamsv1.ListServicesRequest{}); status.Code(err) != codes.Unauthenticated {
			t.Errorf("authorization %q: %v, want Unauthenticated", v, err)
		}
	}
	// A one-model service and its model are one target.
	if _, err := ms.GetModelStatus(withToken(ctx, aliceToken), &tfapis.GetModelStatusRequest{ModelSpec: tfSpec("tfs")}); err != nil {
		t.Errorf("alice, tfm by its service name: %v", err)
	}
	// The token is the frontend's: the pass-through backend does not get it.
	if c, ok := bt.Last("Predict"); !ok || len(c.MD.Get("authorization")) != 0 {
		t.Errorf("pass-through backend call %v: authorization forwarded (or no call)", c.MD)
	}
	// Liveness and readiness stay open.
	if _, err := ks.ServerLive(ctx, &inference.ServerLiveRequest{}); err != nil {
		t.Errorf("ServerLive without a token: %v", err)
	}
	if _, err := ks.ServerReady(ctx, &inference.ServerReadyRequest{}); err != nil {
		t.Errorf("ServerReady without a token: %v", err)
	}

	// HTTP.
	body := `{"inputs": [{"name": "images", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}, {"name": "ids", "datatype": "INT64", "shape": [1], "data": [7]}]}`
	for _, hc := range []struct {
		method, path, body string
		scoped             bool
	}{{"POST", "/v1/services/echo:predict", body, true}, {"GET", "/v1/services", "", false}} {
		for _, tc := range []struct {
			who, authz string
			want       int
		}{
			{"no token", "", http.StatusUnauthorized},
			{"wrong token", "Bearer " + wrongToken, http.StatusUnauthorized},
			{"not bearer", "Basic " + aliceToken, http.StatusUnauthorized},
			{"bob", "Bearer " + bobToken, map[bool]int{true: http.StatusForbidden, false: http.StatusOK}[hc.scoped]},
			{"alice", "Bearer " + aliceToken, http.StatusOK},
		} {
			code, hdr, b := httpDo(t, http.DefaultClient, hc.method, e.httpURL+hc.path, hc.body, tc.authz)
			if code != tc.want {
				t.Errorf("HTTP %s %s, %s: %d %s, want %d", hc.method, hc.path, tc.who, code, b, tc.want)
			}
			if code == http.StatusUnauthorized && !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("HTTP %s, %s: 401 without WWW-Authenticate: Bearer (%v)", hc.path, tc.who, hdr)
			}
		}
	}
	for _, p := range []string{"/healthz", "/metrics"} {
		if code, _, b := httpDo(t, http.DefaultClient, "GET", e.httpURL+p, "", ""); code == http.StatusUnauthorized || code == http.StatusForbidden {
			t.Errorf("%s without a token: %d %s", p, code, b)
		}
	}

	e.stop()
	out := logs.String()
	if !strings.Contains(out, "client call refused") {
		t.Fatalf("refusals were not logged at debug (the check below would prove nothing): %.2000s", out)
	}
	for _, tok := range []string{aliceToken, bobToken, wrongToken} {
		if strings.Contains(out, tok) {
			t.Fatalf("token %q appears in the logs", tok)
		}
	}
}

// httpDo sends one request with an Authorization header (none when
// empty).
func httpDo(t *testing.T, c *http.Client, method, url, body, authz string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// testCA is a certificate authority of a test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial = big.NewInt(1)

func nextSerial() *big.Int {
	serial = new(big.Int).Add(serial, big.NewInt(1))
	return serial
}

func newTestCA(t *testing.T, cn string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a leaf: a server certificate for 127.0.0.1, or a client
// one with the given CN and URI SANs. It returns PEM cert and key.
func (ca *testCA) issue(t *testing.T, cn string, uris []string, server bool) ([]byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

func writeFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// clientTLS is a client's TLS configuration trusting ca, with a client
// certificate when certPEM is given.
func clientTLS(t *testing.T, ca *testCA, certPEM, keyPEM []byte) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.pem)
	c := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if certPEM != nil {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c
}

// TestClientAuthCertificates: with client_ca_file the client ports
// require a client certificate the CA signed (a connection without one,
// or with one of another CA, is refused at the handshake, on gRPC and
// HTTP); a certificate identity (URI SAN or CN) gets its allow list.
func TestClientAuthCertificates(t *testing.T) {
	dir := t.TempDir()
	ca, other := newTestCA(t, "clients CA"), newTestCA(t, "other CA")
	srvCert, srvKey := ca.issue(t, "frontend", nil, true)
	aliceCert, aliceKey := ca.issue(t, "alice", []string{"spiffe://clients/alice"}, false)
	bobCert, bobKey := ca.issue(t, "bob", nil, false)
	eveCert, eveKey := ca.issue(t, "eve", nil, false)
	strayCert, strayKey := other.issue(t, "alice", []string{"spiffe://clients/alice"}, false)
	yaml := fmt.Sprintf(testYAML, "5s") + fmt.Sprintf(`client_auth:
  tls: {cert_file: %q, key_file: %q, client_ca_file: %q}
  certificates:
    - {name: alice, uri: "spiffe://clients/alice", models: [echo]}
    - {name: bob, common_name: bob, models: [fan]}
`, writeFile(t, dir, "srv.pem", srvCert), writeFile(t, dir, "srv.key", srvKey), writeFile(t, dir, "ca.pem", ca.pem))
	e := newEnvWith(t, envOpts{yaml: yaml, config: withClientAuth(t, nil)})
	ctx := ctxT(t, 30*time.Second)
	dial := func(c *tls.Config) hamsv1.FrontendClient {
		creds := grpc.WithTransportCredentials(credentials.NewTLS(c))
		cc, err := grpcx.Dial(e.grpcAddr, 0, creds)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return hamsv1.NewFrontendClient(cc)
	}
	echo := &hamsv1.PredictRequest{Service: "echo", Inputs: echoInputs(1, 1)}
	if _, err := dial(clientTLS(t, ca, aliceCert, aliceKey)).Predict(ctx, echo); err != nil {
		t.Fatalf("alice's certificate, echo: %v", err)
	}
	if _, err := dial(clientTLS(t, ca, bobCert, bobKey)).Predict(ctx, echo); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("bob's certificate, echo: %v, want PermissionDenied", err)
	}
	if _, err := dial(clientTLS(t, ca, eveCert, eveKey)).ListServices(ctx, &hamsv1.ListServicesRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a certificate of the CA naming no listed identity: %v, want Unauthenticated", err)
	}
	for what, c := range map[string]*tls.Config{
		"no client certificate":             clientTLS(t, ca, nil, nil),
		"a certificate of another CA":       clientTLS(t, ca, strayCert, strayKey),
		"a token but no client certificate": clientTLS(t, ca, nil, nil),
	} {
		cctx := withToken(ctx, aliceToken)
		sctx, cancel := context.WithTimeout(cctx, 5*time.Second)
		_, err := dial(c).ListServices(sctx, &hamsv1.ListServicesRequest{})
		cancel()
		if err == nil || status.Code(err) == codes.OK {
			t.Fatalf("%s: connection accepted", what)
		}
	}
	// Plaintext is refused on the TLS port.
	pcc, err := grpcx.Dial(e.grpcAddr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pcc.Close()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = hamsv1.NewFrontendClient(pcc).ListServices(sctx, &hamsv1.ListServicesRequest{})
	cancel()
	if err == nil {
		t.Fatal("a plaintext client was served on the TLS port")
	}

	// HTTP: the same handshake.
	httpsURL := strings.Replace(e.httpURL, "http://", "https://", 1)
	hc := func(c *tls.Config) *http.Client {
		tr := &http.Transport{TLSClientConfig: c}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	body := `{"inputs": [{"name": "images", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}, {"name": "ids", "datatype": "INT64", "shape": [1], "data": [7]}]}`
	if code, _, b := httpDo(t, hc(clientTLS(t, ca, aliceCert, aliceKey)), "POST", httpsURL+"/v1/services/echo:predict", body, ""); code != http.StatusOK {
		t.Fatalf("HTTPS, alice: %d %s", code, b)
	}
	if code, _, b := httpDo(t, hc(clientTLS(t, ca, bobCert, bobKey)), "POST", httpsURL+"/v1/services/echo:predict", body, ""); code != http.StatusForbidden {
		t.Fatalf("HTTPS, bob: %d %s, want 403", code, b)
	}
	req, _ := http.NewRequest("GET", httpsURL+"/healthz", nil)
	if resp, err := hc(clientTLS(t, ca, nil, nil)).Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("HTTPS without a client certificate: %s, want a refused handshake", resp.Status)
	}
}

// TestClientAuthTLSOnly: client_auth with tls alone serves the client
// ports over TLS to every client (no credentials required).
func TestClientAuthTLSOnly(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "server CA")
	srvCert, srvKey := ca.issue(t, "frontend", nil, true)
	yaml := fmt.Sprintf(testYAML, "5s") + fmt.Sprintf("client_auth:\n  tls: {cert_file: %q, key_file: %q}\n",
		writeFile(t, dir, "srv.pem", srvCert), writeFile(t, dir, "srv.key", srvKey))
	e := newEnvWith(t, envOpts{yaml: yaml, config: withClientAuth(t, nil)})
	cc, err := grpcx.Dial(e.grpcAddr, 0, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS(t, ca, nil, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := hamsv1.NewFrontendClient(cc).Predict(ctxT(t, 10*time.Second), &hamsv1.PredictRequest{Service: "echo", Inputs: echoInputs(1, 1)}); err != nil {
		t.Fatalf("TLS client: %v", err)
	}
}

// TestClientAuthKeyPairReload: the client ports' certificate is reloaded
// when its files change, looked at no more than once a second.
func TestClientAuthKeyPairReload(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "CA")
	c1, k1 := ca.issue(t, "one", nil, true)
	c2, k2 := ca.issue(t, "two", nil, true)
	cf, kf := writeFile(t, dir, "c.pem", c1), writeFile(t, dir, "k.pem", k1)
	a, err := NewClientAuth(&config.ClientAuth{TLS: &config.ClientTLS{CertFile: cf, KeyFile: kf}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	a.keys.mu.Lock()
	a.keys.now = func() time.Time { return now }
	a.keys.checked = now
	a.keys.mu.Unlock()
	cn := func() string {
		t.Helper()
		c, err := a.serverTLS().GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf.Subject.CommonName
	}
	if got := cn(); got != "one" {
		t.Fatalf("first certificate %q", got)
	}
	writeFile(t, dir, "c.pem", c2)
	writeFile(t, dir, "k.pem", k2)
	later := time.Now().Add(time.Minute)
	for _, p := range []string{cf, kf} {
		if err := os.Chtimes(p, later, later); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(500 * time.Millisecond)
	if got := cn(); got != "one" {
		t.Fatalf("looked at the files again within a second: %q", got)
	}
	now = now.Add(time.Second)
	if got := cn(); got != "two" {
		t.Fatalf("after the files changed: %q, want two", got)
	}
	// A broken pair keeps the previous one serving.
	writeFile(t, dir, "k.pem", []byte("not a key"))
	if err := os.Chtimes(kf, later.Add(time.Minute), later.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Second)
	if got := cn(); got != "two" {
		t.Fatalf("after a broken key: %q, want two", got)
	}
}

// TestNewClientAuthErrors: unreadable token files, key pairs and CA files
// fail at start; a deployment with client_auth needs Config.ClientAuth.
func TestNewClientAuthErrors(t *testing.T) {
	dir := t.TempDir()
	empty := writeFile(t, dir, "empty", []byte("\n"))
	notPEM := writeFile(t, dir, "ca", []byte("nothing"))
	ca := newTestCA(t, "CA")
	c, k := ca.issue(t, "s", nil, true)
	cf, kf := writeFile(t, dir, "c.pem", c), writeFile(t, dir, "k.pem", k)
	for name, ca := range map[string]*config.ClientAuth{
		"missing token file": {Tokens: []config.ClientCred{{Name: "x", TokenFile: filepath.Join(dir, "nope"), Models: []string{"*"}}}},
		"empty token file":   {Tokens: []config.ClientCred{{Name: "x", TokenFile: empty, Models: []string{"*"}}}},
		"missing key pair":   {TLS: &config.ClientTLS{CertFile: filepath.Join(dir, "nope"), KeyFile: kf}},
		"CA not PEM":         {TLS: &config.ClientTLS{CertFile: cf, KeyFile: kf, ClientCAFile: notPEM}},
		"nil":                nil,
	} {
		if _, err := NewClientAuth(ca, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	dep, err := config.Parse([]byte(fmt.Sprintf(testYAML, "5s") + "client_auth:\n  tokens: [{name: a, sha256: " + strings.Repeat("ab", 32) + ", models: ['*']}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	l := listen(t)
	defer l.Close()
	if _, err := New(Config{Deployment: dep, Resolver: newStaticResolver(), GRPCListener: l, InternalListener: l}); err == nil || !strings.Contains(err.Error(), "client_auth") {
		t.Fatalf("New without ClientAuth for a deployment with client_auth: %v", err)
	}
}
