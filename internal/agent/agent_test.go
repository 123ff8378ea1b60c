package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/pki"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// An agent with certificates answers only managers, over mutual TLS, and
// caps the starts in flight; the manager's client reaches its handler.
func TestAgentAuthorizesManagersOnly(t *testing.T) {
	is, err := pki.NewIssuer(t.TempDir(), "ap", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	sup, err := is.Source("supervisor", pki.Identity{Role: pki.RoleSupervisor})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan Request, 1)
	a, err := Serve(ServerConfig{
		Valid: func(model, _ string) bool { return model == "m" },
		Start: func(_ context.Context, model, role string) (Response, error) {
			started <- Request{Model: model, Role: role}
			return Response{Sidecar: "127.0.0.1:1", ID: "sidecar/m/backup/1", Epoch: 2}, nil
		},
		TLS: sup,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if !strings.HasPrefix(a.URL(), "https://") {
		t.Fatalf("agent URL %s is not https", a.URL())
	}
	post := func(hc *http.Client, url, body string) (int, string, error) {
		resp, err := hc.Post(url, "application/json", bytes.NewReader([]byte(body)))
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	as := func(name string, id pki.Identity) (*http.Client, *pki.Source) {
		src, err := is.Source(name, id)
		if err != nil {
			t.Fatal(err)
		}
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: src.ClientConfig()}}, src
	}
	const unknown = `{"model":"nope","role":"backup"}`

	// Plain HTTP: no answer of the agent's.
	if code, _, err := post(&http.Client{Timeout: 10 * time.Second}, strings.Replace(a.URL(), "https://", "http://", 1), unknown); err == nil && code < 400 {
		t.Fatalf("plain HTTP start answered %d", code)
	}
	// TLS without a client certificate: the handshake fails.
	noCert := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if _, _, err := post(noCert, a.URL(), unknown); err == nil {
		t.Fatal("a client without a certificate got an answer")
	}
	// A sidecar's, an admin's certificate: 403.
	for i, id := range []pki.Identity{{Role: pki.RoleSidecar, Model: "m", Instance: "a"}, {Role: pki.RoleAdmin}} {
		hc, _ := as("other"+string(rune('0'+i)), id)
		code, body, err := post(hc, a.URL(), unknown)
		if err != nil || code != http.StatusForbidden {
			t.Fatalf("%v: %d %q %v, want 403", id, code, body, err)
		}
	}
	// A manager's reaches the handler: an unknown model 400, a known one
	// started (through the manager's client).
	mgr, mgrSrc := as("manager", pki.Identity{Role: pki.RoleManager, Instance: "0"})
	if code, body, err := post(mgr, a.URL(), unknown); err != nil || code != http.StatusBadRequest || !strings.Contains(body, "nope") {
		t.Fatalf("manager, unknown model: %d %q %v, want 400 naming the model", code, body, err)
	}
	c, err := NewClient(a.URL(), mgrSrc)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StartInstance(context.Background(), "m", hamsv1.Role_ROLE_BACKUP); err != nil {
		t.Fatal(err)
	}
	if got := <-started; got != (Request{Model: "m", Role: RoleBackup}) {
		t.Fatalf("started %+v", got)
	}
	// Beyond the cap: 429.
	for range MaxConcurrentStarts {
		a.starts <- struct{}{}
	}
	if code, _, err := post(mgr, a.URL(), `{"model":"m","role":"backup"}`); err != nil || code != http.StatusTooManyRequests {
		t.Fatalf("over the cap: %d %v, want 429", code, err)
	}
	for range MaxConcurrentStarts {
		<-a.starts
	}
}

// A manager with a certificate refuses a plain-HTTP agent.
func TestClientNeedsHTTPSWithCertificate(t *testing.T) {
	is, err := pki.NewIssuer(t.TempDir(), "ap", nil)
	if err != nil {
		t.Fatal(err)
	}
	src, err := is.Source("manager", pki.Identity{Role: pki.RoleManager})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewClient("http://127.0.0.1:1/instances", src); err == nil {
		t.Fatal("a manager with a certificate accepted a plain-HTTP agent")
	}
	if _, err := NewClient("https://127.0.0.1:1/instances", src); err != nil {
		t.Fatal(err)
	}
	if _, err := NewClient("ftp://x", nil); err == nil {
		t.Fatal("a non-http URL accepted")
	}
}
