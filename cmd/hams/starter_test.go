package main

import (
	"bytes"
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/pki"
)

// The instance agent of a deployment with certificates answers only
// managers, over mutual TLS, and caps the starts in flight.
func TestAgentAuthorizesManagersOnly(t *testing.T) {
	dir := t.TempDir()
	p, err := newDeployPKI(dir, "ap")
	if err != nil {
		t.Fatal(err)
	}
	d := &deployment{dep: &config.Deployment{Name: "ap"}, pki: p, log: slog.New(slog.DiscardHandler)}
	a, err := newAgent(d)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if !strings.HasPrefix(a.URL(), "https://") {
		t.Fatalf("agent URL %s is not https", a.URL())
	}
	post := func(hc *http.Client, url string) (int, string, error) {
		resp, err := hc.Post(url, "application/json", bytes.NewReader([]byte(`{"model":"nope","role":"backup"}`)))
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	as := func(id pki.Identity) *http.Client {
		src, err := p.source("test-"+id.Role.String(), id)
		if err != nil {
			t.Fatal(err)
		}
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: src.ClientConfig()}}
	}

	// Plain HTTP: no answer of the agent's.
	if code, _, err := post(&http.Client{Timeout: 10 * time.Second}, strings.Replace(a.URL(), "https://", "http://", 1)); err == nil && code < 400 {
		t.Fatalf("plain HTTP start answered %d", code)
	}
	// TLS without a client certificate: the handshake fails.
	noCert := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if _, _, err := post(noCert, a.URL()); err == nil {
		t.Fatal("a client without a certificate got an answer")
	}
	// A sidecar's, an admin's certificate: 403.
	for _, id := range []pki.Identity{{Role: pki.RoleSidecar, Model: "m", Instance: "a"}, {Role: pki.RoleAdmin}} {
		code, body, err := post(as(id), a.URL())
		if err != nil || code != http.StatusForbidden {
			t.Fatalf("%v: %d %q %v, want 403", id, code, body, err)
		}
	}
	// A manager's reaches the handler (which refuses the unknown model).
	mgr := as(pki.Identity{Role: pki.RoleManager, Instance: "0"})
	if code, body, err := post(mgr, a.URL()); err != nil || code != http.StatusBadRequest || !strings.Contains(body, "nope") {
		t.Fatalf("manager: %d %q %v, want 400 naming the model", code, body, err)
	}
	// Beyond the cap: 429.
	for range maxConcurrentStarts {
		a.starts <- struct{}{}
	}
	if code, _, err := post(mgr, a.URL()); err != nil || code != http.StatusTooManyRequests {
		t.Fatalf("over the cap: %d %v, want 429", code, err)
	}
	for range maxConcurrentStarts {
		<-a.starts
	}
}

// The manager's starter refuses a plain-HTTP agent once it has a
// certificate.
func TestStarterNeedsHTTPSWithCertificate(t *testing.T) {
	p, err := newDeployPKI(t.TempDir(), "ap")
	if err != nil {
		t.Fatal(err)
	}
	src, err := p.source("manager", pki.Identity{Role: pki.RoleManager})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newHTTPStarter("http://127.0.0.1:1/instances", src); err == nil {
		t.Fatal("a manager with a certificate accepted a plain-HTTP agent")
	}
	if _, err := newHTTPStarter("https://127.0.0.1:1/instances", src); err != nil {
		t.Fatal(err)
	}
}
