package main

// Restoring redundancy across processes. The manager decides when a new
// backup or standby is needed (manager.InstanceStarter); the process that
// can start one is whoever supervises the deployment's processes. On the
// embedded default that is the `hams up|demo|chaos` parent, which serves a
// tiny HTTP "instance agent" on loopback and passes its URL to the manager
// as --starter. The manager POSTs {"model": M, "role": "backup"|"standby"}
// to it; the agent starts a new instance (model server + sidecar,
// registered in that role at the model's current epoch) and answers 200
// once the sidecar is serving (it then registers with the manager, and the
// manager's recovery syncs a new backup from the primary). Any other
// supervisor (systemd, Kubernetes) can implement the same one-call
// protocol. Both managers of an active/standby pair get the same URL; only
// the active one ever calls it.

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/hams-go/hams/internal/authz"
	"github.com/hams-go/hams/internal/pki"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// startRequest is the body of a POST to the instance agent.
type startRequest struct {
	Model string `json:"model"`
	Role  string `json:"role"` // backup or standby
}

// startResponse is the agent's answer on success.
type startResponse struct {
	Sidecar string `json:"sidecar"` // the new sidecar's gRPC address
	ID      string `json:"id"`
	Epoch   uint64 `json:"epoch"`
}

// httpStarter implements manager.InstanceStarter by calling an instance
// agent.
type httpStarter struct {
	url string
	hc  *http.Client
}

// newHTTPStarter calls the agent at raw; with src (the manager's
// certificate) over mutual TLS, which the agent requires of a secure
// deployment (https).
func newHTTPStarter(raw string, src *pki.Source) (*httpStarter, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%q is not an http(s) URL", raw)
	}
	if src != nil && u.Scheme != "https" {
		return nil, fmt.Errorf("%q: a manager with a certificate calls its instance agent over https only", raw)
	}
	hc := &http.Client{}
	if src != nil {
		hc.Transport = &http.Transport{TLSClientConfig: src.ClientConfig(), ForceAttemptHTTP2: false}
	}
	return &httpStarter{url: raw, hc: hc}, nil
}

func (h *httpStarter) StartInstance(ctx context.Context, model string, role hamsv1.Role) error {
	body, _ := json.Marshal(startRequest{Model: model, Role: roleName(role)})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("start instance: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.hc.Do(req)
	if err != nil {
		return fmt.Errorf("start instance of %s (%s) at %s: %w", model, roleName(role), h.url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("start instance of %s (%s) at %s: %s: %s", model, roleName(role), h.url, resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

// agent is the HTTP instance agent of a deployment.
type agent struct {
	d   *deployment
	lis net.Listener
	srv *http.Server
	url string
	// authz admits only managers (authz.StartInstance) when the
	// deployment has certificates (nil: --insecure).
	authz *authz.Authorizer
	// starts bounds the instances being started at once: a start is a
	// model server and a sidecar process; beyond the cap the agent
	// answers 429 and the manager retries.
	starts chan struct{}
}

// maxConcurrentStarts caps the agent's starts in flight.
const maxConcurrentStarts = 4

func newAgent(d *deployment) (*agent, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("instance agent: listen: %w", err)
	}
	a := &agent{d: d, lis: lis, url: "http://" + lis.Addr().String() + "/instances", starts: make(chan struct{}, maxConcurrentStarts)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /instances", a.handle)
	a.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 16 << 10}
	if d.pki != nil {
		src := d.pki.supervisor
		if a.authz, err = authz.New(authz.Config{Self: src.Identity(), Logger: d.log}); err != nil {
			lis.Close()
			return nil, fmt.Errorf("instance agent: %w", err)
		}
		a.srv.TLSConfig = src.ServerConfig()
		a.url = "https://" + lis.Addr().String() + "/instances"
		lis = tls.NewListener(lis, a.srv.TLSConfig)
	}
	go func() { _ = a.srv.Serve(lis) }()
	return a, nil
}

func (a *agent) URL() string { return a.url }

func (a *agent) handle(w http.ResponseWriter, r *http.Request) {
	if a.authz != nil {
		if r.TLS == nil {
			http.Error(w, "instance agent: mutual TLS required", http.StatusUnauthorized)
			return
		}
		caller, err := pki.IdentityOf(*r.TLS)
		if err != nil {
			http.Error(w, "instance agent: "+err.Error(), http.StatusUnauthorized)
			return
		}
		if err := a.authz.Allow(authz.StartInstance, caller, nil); err != nil {
			a.d.log.Warn("instance agent: start refused", "caller", caller.String(), "err", err)
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
	}
	select {
	case a.starts <- struct{}{}:
		defer func() { <-a.starts }()
	default:
		http.Error(w, fmt.Sprintf("instance agent: %d starts already in progress", maxConcurrentStarts), http.StatusTooManyRequests)
		return
	}
	var req startRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&req); err != nil {
		http.Error(w, "bad request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if a.d.dep.Model(req.Model) == nil || (req.Role != roleBackup && req.Role != roleStandby) {
		http.Error(w, fmt.Sprintf("cannot start model %q in role %q", req.Model, req.Role), http.StatusBadRequest)
		return
	}
	in, err := a.d.startForRecovery(r.Context(), req.Model, req.Role)
	if err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			code = http.StatusServiceUnavailable
		}
		http.Error(w, err.Error(), code)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(startResponse{Sidecar: in.SidecarAddr, ID: in.ID, Epoch: in.Epoch})
}

// Close stops serving (in-flight starts see their context end).
func (a *agent) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := a.srv.Shutdown(ctx); err != nil {
		_ = a.srv.Close()
	}
}
