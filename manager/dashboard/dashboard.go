// Package dashboard serves a manager's live, read-only dashboard over HTTP:
// the service graph with every instance's role and health (from the
// topology the manager holds), per-model throughput, latency, durability
// lag and output-log size (scraped from the components' Prometheus
// /metrics, whose addresses the components register), ParM
// reconstructions, and the recovery timeline (timeline.Ring, fed by the
// manager). Static assets are embedded; live data goes over Server-Sent
// Events (/api/events) and the same state is a JSON document at
// /api/state. See docs/dashboard.md.
package dashboard

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/manager/dashboard/timeline"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

//go:embed static
var static embed.FS

// Errors.
var (
	// ErrConfig is wrapped by every Config validation error.
	ErrConfig = errors.New("dashboard: invalid config")
	// ErrAlreadyRun is returned by a second call of Run.
	ErrAlreadyRun = errors.New("dashboard: Run called more than once")
)

// Source is what the dashboard reads from the manager
// (*manager.Manager implements it).
type Source interface {
	// Topology is the newest deployment state (nil before it is loaded).
	Topology() *hamsv1.Topology
	// Active reports whether the manager holds the lease.
	Active() bool
	// Registrations of the components (their metrics addresses).
	Registrations() []*hamsv1.RegisterRequest
}

// Defaults.
const (
	DefaultScrapeInterval = time.Second
	DefaultWindow         = 10 * time.Second
	// idleAfter: scraping pauses when nobody has looked for this long.
	idleAfter = 30 * time.Second
	// pushEvery bounds how often one SSE stream is sent a state.
	pushEvery = 200 * time.Millisecond
)

// Config of a Server.
type Config struct {
	Deployment *config.Deployment
	Source     Source
	// Timeline holds the manager's recovery events (optional: an empty
	// timeline).
	Timeline *timeline.Ring
	// Listener serves the dashboard; Run closes it.
	Listener net.Listener
	// ManagerID names the manager on the page.
	ManagerID string
	// ScrapeInterval between scrapes of the components' /metrics
	// (default DefaultScrapeInterval); Window is what rates and
	// percentiles cover (default DefaultWindow).
	ScrapeInterval time.Duration
	Window         time.Duration
	// HTTPClient scrapes (default: a client with a timeout of one
	// ScrapeInterval).
	HTTPClient *http.Client
	Logger     *slog.Logger
}

// Server is the dashboard.
type Server struct {
	cfg      Config
	log      *slog.Logger
	scr      *scraper
	ran      atomic.Bool
	lastView atomic.Int64 // unix nanos of the last page or API read
	// scraped is closed and replaced after every scrape round.
	mu      sync.Mutex
	scraped chan struct{}
}

// New validates cfg and applies defaults; it does no I/O.
func New(cfg Config) (*Server, error) {
	var errs []error
	if cfg.Deployment == nil {
		errs = append(errs, fmt.Errorf("%w: Deployment is required", ErrConfig))
	}
	if cfg.Source == nil {
		errs = append(errs, fmt.Errorf("%w: Source is required", ErrConfig))
	}
	if cfg.Listener == nil {
		errs = append(errs, fmt.Errorf("%w: Listener is required", ErrConfig))
	}
	if cfg.ScrapeInterval == 0 {
		cfg.ScrapeInterval = DefaultScrapeInterval
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.ScrapeInterval < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("%w: ScrapeInterval %v is below 10ms", ErrConfig, cfg.ScrapeInterval))
	}
	if cfg.Window < cfg.ScrapeInterval {
		errs = append(errs, fmt.Errorf("%w: Window %v is shorter than ScrapeInterval %v", ErrConfig, cfg.Window, cfg.ScrapeInterval))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Timeline == nil {
		cfg.Timeline = timeline.NewRing(0)
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: max(cfg.ScrapeInterval, 500*time.Millisecond)}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Server{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "dashboard"),
		scr:     newScraper(cfg.HTTPClient, cfg.Window),
		scraped: make(chan struct{}),
	}, nil
}

// Addr is the dashboard's listen address.
func (s *Server) Addr() string { return s.cfg.Listener.Addr().String() }

// Handler serves the page, /api/state and /api/events.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	sub, _ := fs.Sub(static, "static")
	files := http.FileServerFS(sub)
	mux.Handle("GET /", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.viewed()
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	}))
	mux.HandleFunc("GET /api/state", s.serveState)
	mux.HandleFunc("GET /api/events", s.serveEvents)
	return secureHeaders(mux)
}

// secureHeaders: the page loads only its own assets and may not be framed.
func secureHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		h.ServeHTTP(w, r)
	})
}

// Run serves the dashboard and scrapes the components until ctx ends; it
// returns once both have stopped.
func (s *Server) Run(ctx context.Context) error {
	if !s.ran.CompareAndSwap(false, true) {
		return ErrAlreadyRun
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.scrapeLoop(ctx)
	}()
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(s.cfg.Listener) }()
	s.log.Info("dashboard serving", "url", "http://"+s.Addr()+"/")
	var err error
	select {
	case err = <-errc:
		cancel()
	case <-ctx.Done():
		// SSE streams end on ctx (their BaseContext); Shutdown waits.
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = hs.Shutdown(sctx)
		scancel()
		err = <-errc
	}
	wg.Wait()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("dashboard: serve %s: %w", s.Addr(), err)
	}
	return nil
}

func (s *Server) viewed() { s.lastView.Store(time.Now().UnixNano()) }

// scrapeLoop scrapes every component with a metrics address each
// interval, while someone looked at the dashboard recently.
func (s *Server) scrapeLoop(ctx context.Context) {
	tk := time.NewTicker(s.cfg.ScrapeInterval)
	defer tk.Stop()
	for {
		if time.Since(time.Unix(0, s.lastView.Load())) < idleAfter {
			s.scr.scrapeAll(ctx, s.targets())
			s.mu.Lock()
			close(s.scraped)
			s.scraped = make(chan struct{})
			s.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
	}
}

func (s *Server) scrapedCh() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.scraped
}

// targets are the registered components with a metrics address.
func (s *Server) targets() []target {
	var out []target
	for _, r := range s.cfg.Source.Registrations() {
		if r.GetMetricsAddress() == "" {
			continue
		}
		switch r.GetKind() {
		case hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR, hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND:
			out = append(out, target{id: r.GetId(), addr: r.GetMetricsAddress()})
		}
	}
	return out
}

func (s *Server) serveState(w http.ResponseWriter, r *http.Request) {
	s.viewed()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s.State(time.Now())); err != nil {
		s.log.Debug("write state", "err", err)
	}
}

// serveEvents streams the state as Server-Sent Events (event "state"):
// at once, then after every scrape round, timeline event and topology
// change (at most every pushEvery), and at least every scrape interval.
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	ctx := r.Context()
	tk := time.NewTicker(s.cfg.ScrapeInterval)
	defer tk.Stop()
	poll := time.NewTicker(pushEvery)
	defer poll.Stop()
	var lastRev uint64
	for {
		s.viewed()
		st := s.State(time.Now())
		lastRev = st.Revision
		b, err := json.Marshal(st)
		if err != nil {
			s.log.Error("encode state", "err", err)
			return
		}
		if _, err := fmt.Fprintf(w, "event: state\ndata: %s\n\n", b); err != nil {
			return
		}
		fl.Flush()
		tl, scraped := s.cfg.Timeline.Changed(), s.scrapedCh()
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-tl:
				break wait
			case <-scraped:
				break wait
			case <-tk.C:
				break wait
			case <-poll.C:
				if t := s.cfg.Source.Topology(); t != nil && t.GetRevision() != lastRev {
					break wait
				}
			}
		}
		// Coalesce bursts (a recovery round emits several events).
		select {
		case <-ctx.Done():
			return
		case <-time.After(pushEvery / 4):
		}
	}
}
