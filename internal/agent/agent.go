// Package agent is the instance agent protocol: the manager decides when
// a new backup or standby is needed (manager.InstanceStarter) and asks
// whoever supervises the deployment's processes to start one, with a
// POST of {"model": M, "role": "backup"|"standby"} to /instances; the
// agent answers 200 once the new instance serves. Client is the manager's
// side, Server the supervisor's (`hams up|demo|chaos` run one; systemd or
// Kubernetes can implement the same one-call protocol). With certificates
// the agent serves https and admits only managers (authz.StartInstance),
// and at most MaxConcurrentStarts starts run at once (429 beyond).
package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/hams-go/hams/internal/authz"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/internal/run"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Roles an agent starts.
const (
	RoleBackup  = "backup"
	RoleStandby = "standby"
)

// MaxConcurrentStarts caps a Server's starts in flight.
const MaxConcurrentStarts = 4

// Request is the body of a POST to the agent.
type Request struct {
	Model string `json:"model"`
	Role  string `json:"role"` // backup or standby
}

// Response is the agent's answer on success.
type Response struct {
	Sidecar string `json:"sidecar"` // the new sidecar's gRPC address
	ID      string `json:"id"`
	Epoch   uint64 `json:"epoch"`
}

func roleName(r hamsv1.Role) string {
	switch r {
	case hamsv1.Role_ROLE_BACKUP:
		return RoleBackup
	case hamsv1.Role_ROLE_STANDBY:
		return RoleStandby
	case hamsv1.Role_ROLE_PRIMARY:
		return "primary"
	}
	return "active"
}

// Client implements manager.InstanceStarter by calling an agent.
type Client struct {
	url string
	hc  *http.Client
}

// NewClient calls the agent at raw; with src (the manager's certificate)
// over mutual TLS, which an agent of a secure deployment requires (https).
func NewClient(raw string, src *pki.Source) (*Client, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%q is not an http(s) URL", raw)
	}
	if src != nil && u.Scheme != "https" {
		return nil, fmt.Errorf("%q: a manager with a certificate calls its instance agent over https only", raw)
	}
	hc := &http.Client{}
	if src != nil {
		hc.Transport = &http.Transport{TLSClientConfig: src.ClientConfig()}
	}
	return &Client{url: raw, hc: hc}, nil
}

// ErrBusy: the agent runs MaxConcurrentStarts starts already (429).
var ErrBusy = errors.New("agent: instance agent busy")

// StartInstance asks the agent for a new instance of model in role. An
// agent busy with other starts (429: after a partition healed, the manager
// asks for many at once) is asked again, backing off up to a second, until
// ctx ends: a start given up on leaves its model short of a backup or
// standby for good (a 30-minute soak, 2026-11-27).
func (c *Client) StartInstance(ctx context.Context, model string, role hamsv1.Role) error {
	backoff := 50 * time.Millisecond
	for {
		err := c.startOnce(ctx, model, role)
		if !errors.Is(err, ErrBusy) {
			return err
		}
		if !run.Sleep(ctx, backoff) {
			return err
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (c *Client) startOnce(ctx context.Context, model string, role hamsv1.Role) error {
	body, _ := json.Marshal(Request{Model: model, Role: roleName(role)})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("start instance: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("start instance of %s (%s) at %s: %w", model, roleName(role), c.url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusTooManyRequests:
		return fmt.Errorf("start instance of %s (%s) at %s: %w: %s", model, roleName(role), c.url, ErrBusy, bytes.TrimSpace(b))
	}
	return fmt.Errorf("start instance of %s (%s) at %s: %s: %s", model, roleName(role), c.url, resp.Status, bytes.TrimSpace(b))
}

// ServerConfig of a Server.
type ServerConfig struct {
	// Valid reports whether model may be started in role (a model of the
	// deployment with that kind of spare).
	Valid func(model, role string) bool
	// Start starts the instance and returns once it serves.
	Start func(ctx context.Context, model, role string) (Response, error)
	// TLS, when set, serves https and admits managers only.
	TLS    *pki.Source
	Logger *slog.Logger
}

// Server is a running agent.
type Server struct {
	cfg    ServerConfig
	srv    *http.Server
	url    string
	authz  *authz.Authorizer
	starts chan struct{}
}

// Serve starts an agent on a free loopback port.
func Serve(cfg ServerConfig) (*Server, error) {
	if cfg.Valid == nil || cfg.Start == nil {
		return nil, errors.New("agent: Valid and Start are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("instance agent: listen: %w", err)
	}
	a := &Server{cfg: cfg, url: "http://" + lis.Addr().String() + "/instances", starts: make(chan struct{}, MaxConcurrentStarts)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /instances", a.handle)
	a.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 16 << 10}
	if cfg.TLS != nil {
		if a.authz, err = authz.New(authz.Config{Self: cfg.TLS.Identity(), Logger: cfg.Logger}); err != nil {
			lis.Close()
			return nil, fmt.Errorf("instance agent: %w", err)
		}
		a.srv.TLSConfig = cfg.TLS.ServerConfig()
		a.url = "https://" + lis.Addr().String() + "/instances"
		lis = tls.NewListener(lis, a.srv.TLSConfig)
	}
	go func() { _ = a.srv.Serve(lis) }()
	return a, nil
}

// URL is the agent's endpoint (a manager's --starter).
func (a *Server) URL() string { return a.url }

func (a *Server) handle(w http.ResponseWriter, r *http.Request) {
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
			a.cfg.Logger.Warn("instance agent: start refused", "caller", caller.String(), "err", err)
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
	}
	select {
	case a.starts <- struct{}{}:
		defer func() { <-a.starts }()
	default:
		http.Error(w, fmt.Sprintf("instance agent: %d starts already in progress", MaxConcurrentStarts), http.StatusTooManyRequests)
		return
	}
	var req Request
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&req); err != nil {
		http.Error(w, "bad request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if (req.Role != RoleBackup && req.Role != RoleStandby) || !a.cfg.Valid(req.Model, req.Role) {
		http.Error(w, fmt.Sprintf("cannot start model %q in role %q", req.Model, req.Role), http.StatusBadRequest)
		return
	}
	resp, err := a.cfg.Start(r.Context(), req.Model, req.Role)
	if err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			code = http.StatusServiceUnavailable
		}
		http.Error(w, err.Error(), code)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// Close stops serving (in-flight starts see their context end).
func (a *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := a.srv.Shutdown(ctx); err != nil {
		_ = a.srv.Close()
	}
}
