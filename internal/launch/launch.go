package launch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Sentinel errors.
var (
	ErrClosed   = errors.New("launch: supervisor closed")
	ErrUnknown  = errors.New("launch: unknown child")
	ErrExists   = errors.New("launch: child already started")
	ErrNotReady = errors.New("launch: child did not become ready")
)

// Config configures a Supervisor.
type Config struct {
	// RunDir receives one <name>.log per child (its stderr). Required.
	RunDir string
	// Executable is the program every child runs; default os.Executable().
	Executable string
	// Env is appended to the parent's environment for every child.
	Env []string
	// ReadyTimeout bounds the wait for a child's ready line (default 30s).
	ReadyTimeout time.Duration
	// Grace is how long Close waits after SIGTERM before SIGKILL (default 5s).
	Grace time.Duration
	// MinBackoff and MaxBackoff bound the delay before a restart (defaults
	// 50ms and 5s). The delay doubles after each restart of a child that
	// ran less than StableAfter (default 10s) and resets otherwise.
	MinBackoff, MaxBackoff time.Duration
	StableAfter            time.Duration
	Logger                 *slog.Logger
}

// Ready is a child's ready line: the raw JSON object and its fields.
type Ready struct {
	Raw    json.RawMessage
	Fields map[string]any
	// PID of the process that printed it.
	PID int
	// Generation counts starts of this child: 1 for the first, +1 per restart.
	Generation int
	// At is when the line was read.
	At time.Time
}

// String returns a string field of the ready line ("" when absent).
func (r Ready) String(key string) string {
	if v, ok := r.Fields[key].(string); ok {
		return v
	}
	return ""
}

// Spec describes one child.
type Spec struct {
	// Name identifies the child (log file name; Kill and Ready use it).
	Name string
	Args []string
	// Restart, if set, returns the arguments for a restart given the last
	// ready line (e.g. to listen on the same address again).
	Restart func(last Ready) []string
	// NoRestart: when the process exits it is not restarted; the child
	// stays known (Ready returns its last ready line, Exited reports the
	// exit) and its name stays taken.
	NoRestart bool
}

// Event reports a child's lifecycle change.
type Event struct {
	Name string
	// Kind is "ready", "exit" or "restart-failed".
	Kind  string
	Ready Ready
	Err   error
	At    time.Time
}

// Supervisor runs and restarts child processes.
type Supervisor struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	closed   bool
	children map[string]*child
	subs     []chan Event
	wg       sync.WaitGroup
	stop     chan struct{}
}

type child struct {
	spec Spec

	mu      sync.Mutex
	proc    *os.Process
	ready   Ready
	hasRdy  bool
	exited  bool          // a NoRestart child whose process ended
	readyCh chan struct{} // closed and replaced on every ready line
	done    chan struct{} // closed when the supervise loop ends
}

// New validates cfg; it starts nothing.
func New(cfg Config) (*Supervisor, error) {
	if cfg.RunDir == "" {
		return nil, fmt.Errorf("launch: RunDir is required")
	}
	if cfg.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("launch: find own executable: %w", err)
		}
		cfg.Executable = exe
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 5 * time.Second
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 50 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = 5 * time.Second
	}
	if cfg.StableAfter <= 0 {
		cfg.StableAfter = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Supervisor{cfg: cfg, log: cfg.Logger, children: map[string]*child{}, stop: make(chan struct{})}, nil
}

// Subscribe returns a channel receiving every later Event. Events are
// dropped for a subscriber whose buffer (256) is full.
func (s *Supervisor) Subscribe() <-chan Event {
	ch := make(chan Event, 256)
	s.mu.Lock()
	s.subs = append(s.subs, ch)
	s.mu.Unlock()
	return ch
}

func (s *Supervisor) emit(ev Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range s.subs {
		select {
		case ch <- ev:
		default:
		}
	}
}

// LogPath is the stderr log file of the named child.
func (s *Supervisor) LogPath(name string) string {
	return filepath.Join(s.cfg.RunDir, FileName(name)+".log")
}

// FileName makes a child name a file name (characters outside
// [A-Za-z0-9._-] become '_'): its log's, and its certificate's.
func FileName(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, name)
}

// Start runs the child and blocks until it printed its ready line. If the
// first start fails (exit or timeout before ready, or ctx ends) the child
// is not supervised and the error includes the tail of its log. After a
// successful Start the child is restarted whenever it exits.
func (s *Supervisor) Start(ctx context.Context, spec Spec) (Ready, error) {
	if spec.Name == "" {
		return Ready{}, fmt.Errorf("launch: child without a name")
	}
	if err := os.MkdirAll(s.cfg.RunDir, 0o755); err != nil {
		return Ready{}, fmt.Errorf("launch: create run dir: %w", err)
	}
	c := &child{spec: spec, readyCh: make(chan struct{}), done: make(chan struct{})}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return Ready{}, ErrClosed
	}
	if _, ok := s.children[spec.Name]; ok {
		s.mu.Unlock()
		return Ready{}, fmt.Errorf("%w: %s", ErrExists, spec.Name)
	}
	s.mu.Unlock()

	r, wait, err := s.spawn(ctx, c, spec.Args, 1)
	if err != nil {
		return Ready{}, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.terminate(c, wait)
		return Ready{}, ErrClosed
	}
	s.children[spec.Name] = c
	s.wg.Add(1)
	s.mu.Unlock()
	go s.supervise(c, wait, r)
	return r, nil
}

// spawn starts one process of c and waits for its ready line. wait
// delivers the process's exit (exactly once).
func (s *Supervisor) spawn(ctx context.Context, c *child, args []string, gen int) (Ready, <-chan error, error) {
	logf, err := os.OpenFile(s.LogPath(c.spec.Name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return Ready{}, nil, fmt.Errorf("launch: open log of %s: %w", c.spec.Name, err)
	}
	// The supervisor's own records in the child's log are JSON lines like
	// the child's (slog's JSON handler): every line of a log parses.
	flog := slog.New(slog.NewJSONHandler(logf, nil)).With("supervisor", "launch", "child", c.spec.Name)
	flog.Info("launch: start", "generation", gen, "exe", filepath.Base(s.cfg.Executable), "args", args)
	cmd := exec.Command(s.cfg.Executable, args...)
	cmd.Env = append(os.Environ(), s.cfg.Env...)
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return Ready{}, nil, fmt.Errorf("launch: stdout pipe of %s: %w", c.spec.Name, err)
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return Ready{}, nil, fmt.Errorf("launch: start %s: %w", c.spec.Name, err)
	}
	c.mu.Lock()
	c.proc = cmd.Process
	c.mu.Unlock()

	lines := make(chan []byte, 1)
	go func() {
		// The first JSON object line is the ready line; everything else on
		// stdout goes to the log. Draining continues so the child never
		// blocks on a full pipe.
		br := bufio.NewReader(stdout)
		sent := false
		for {
			line, err := br.ReadBytes('\n')
			trimmed := bytes.TrimSpace(line)
			if !sent && len(trimmed) > 0 && trimmed[0] == '{' && json.Valid(trimmed) {
				lines <- append([]byte(nil), trimmed...)
				sent = true
			} else if len(trimmed) > 0 {
				flog.Info("launch: stdout", "line", string(trimmed))
			}
			if err != nil {
				if !sent {
					close(lines)
				}
				return
			}
		}
	}()
	wait := make(chan error, 1)
	go func() {
		// Wait closes stdout after the process exits, ending the reader.
		err := cmd.Wait()
		flog.Info("launch: exit", "generation", gen, "err", errString(err))
		logf.Close()
		wait <- err
	}()

	timer := time.NewTimer(s.cfg.ReadyTimeout)
	defer timer.Stop()
	fail := func(why error) (Ready, <-chan error, error) {
		_ = killGroup(cmd.Process.Pid, syscall.SIGKILL)
		<-wait
		return Ready{}, nil, fmt.Errorf("%w: %s: %v; log tail:\n%s", ErrNotReady, c.spec.Name, why, tail(s.LogPath(c.spec.Name), 2048))
	}
	select {
	case line, ok := <-lines:
		if !ok {
			// stdout closed without a ready line: the process is exiting.
			err := <-wait
			return Ready{}, nil, fmt.Errorf("%w: %s exited (%v) before its ready line; log tail:\n%s", ErrNotReady, c.spec.Name, err, tail(s.LogPath(c.spec.Name), 2048))
		}
		r := Ready{Raw: line, PID: cmd.Process.Pid, Generation: gen, At: time.Now()}
		if err := json.Unmarshal(line, &r.Fields); err != nil {
			return fail(fmt.Errorf("bad ready line %q: %w", line, err))
		}
		c.mu.Lock()
		c.ready = r
		c.hasRdy = true
		close(c.readyCh)
		c.readyCh = make(chan struct{})
		c.mu.Unlock()
		s.log.Info("child ready", "name", c.spec.Name, "pid", r.PID, "generation", gen, "ready", string(line))
		s.emit(Event{Name: c.spec.Name, Kind: "ready", Ready: r, At: r.At})
		return r, wait, nil
	case <-timer.C:
		return fail(fmt.Errorf("no ready line within %v", s.cfg.ReadyTimeout))
	case <-ctx.Done():
		return fail(ctx.Err())
	case <-s.stop:
		return fail(ErrClosed)
	}
}

// supervise waits for the child to exit and restarts it until Close.
func (s *Supervisor) supervise(c *child, wait <-chan error, last Ready) {
	defer s.wg.Done()
	defer close(c.done)
	backoff := s.cfg.MinBackoff
	gen := last.Generation
	started := time.Now()
	for {
		var err error
		select {
		case err = <-wait:
		case <-s.stop:
			s.terminate(c, wait)
			return
		}
		if s.isClosed() {
			return
		}
		if c.spec.NoRestart {
			s.log.Info("child exited (not restarted)", "name", c.spec.Name, "err", err)
			c.mu.Lock()
			c.exited = true
			c.mu.Unlock()
			s.emit(Event{Name: c.spec.Name, Kind: "exit", Err: err, At: time.Now()})
			return
		}
		s.log.Warn("child exited; restarting", "name", c.spec.Name, "err", err, "backoff", backoff)
		s.emit(Event{Name: c.spec.Name, Kind: "exit", Err: err, At: time.Now()})
		if time.Since(started) >= s.cfg.StableAfter {
			backoff = s.cfg.MinBackoff
		}
		for {
			select {
			case <-time.After(backoff):
			case <-s.stop:
				return
			}
			backoff = min(2*backoff, s.cfg.MaxBackoff)
			args := c.spec.Args
			if c.spec.Restart != nil {
				args = c.spec.Restart(last)
			}
			gen++
			started = time.Now()
			r, w, err := s.spawn(context.Background(), c, args, gen)
			if err == nil {
				last, wait = r, w
				break
			}
			if s.isClosed() {
				return
			}
			s.log.Warn("restart failed", "name", c.spec.Name, "err", err)
			s.emit(Event{Name: c.spec.Name, Kind: "restart-failed", Err: err, At: time.Now()})
		}
	}
}

func (s *Supervisor) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// terminate stops one process: SIGTERM to its group, SIGKILL after Grace.
func (s *Supervisor) terminate(c *child, wait <-chan error) {
	c.mu.Lock()
	p := c.proc
	c.mu.Unlock()
	_ = killGroup(p.Pid, syscall.SIGTERM)
	select {
	case <-wait:
	case <-time.After(s.cfg.Grace):
		s.log.Warn("child ignored SIGTERM; killing", "name", c.spec.Name, "pid", p.Pid)
		_ = killGroup(p.Pid, syscall.SIGKILL)
		<-wait
	}
}

// Ready returns the latest ready line of the named child.
func (s *Supervisor) Ready(name string) (Ready, bool) {
	s.mu.Lock()
	c := s.children[name]
	s.mu.Unlock()
	if c == nil {
		return Ready{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ready, c.hasRdy
}

// WaitReady blocks until the named child has a ready line of a generation
// above after (pass the generation seen before a kill to wait for the
// restart).
func (s *Supervisor) WaitReady(ctx context.Context, name string, after int) (Ready, error) {
	s.mu.Lock()
	c := s.children[name]
	s.mu.Unlock()
	if c == nil {
		return Ready{}, fmt.Errorf("%w: %s", ErrUnknown, name)
	}
	for {
		c.mu.Lock()
		r, ch := c.ready, c.readyCh
		c.mu.Unlock()
		if r.Generation > after {
			return r, nil
		}
		select {
		case <-ch:
		case <-c.done:
			return Ready{}, fmt.Errorf("%w: %s", ErrClosed, name)
		case <-ctx.Done():
			return Ready{}, fmt.Errorf("wait for %s: %w", name, ctx.Err())
		}
	}
}

// Kill sends sig to the named child's process group. A child that exits
// because of it is restarted like after any other exit.
func (s *Supervisor) Kill(name string, sig syscall.Signal) (pid int, err error) {
	s.mu.Lock()
	c := s.children[name]
	s.mu.Unlock()
	if c == nil {
		return 0, fmt.Errorf("%w: %s", ErrUnknown, name)
	}
	c.mu.Lock()
	p, exited := c.proc, c.exited
	c.mu.Unlock()
	if exited {
		return p.Pid, fmt.Errorf("%w: %s has exited", ErrUnknown, name)
	}
	if err := killGroup(p.Pid, sig); err != nil {
		return p.Pid, fmt.Errorf("launch: signal %s (pid %d): %w", name, p.Pid, err)
	}
	s.log.Info("signalled child", "name", name, "pid", p.Pid, "signal", sig.String())
	return p.Pid, nil
}

// Pid returns the process id of the named child's current process.
func (s *Supervisor) Pid(name string) (int, bool) {
	s.mu.Lock()
	c := s.children[name]
	s.mu.Unlock()
	if c == nil {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil || c.exited {
		return 0, false
	}
	return c.proc.Pid, true
}

// Exited reports whether the named NoRestart child's process has ended
// (false for unknown children and for children that are restarted).
func (s *Supervisor) Exited(name string) bool {
	s.mu.Lock()
	c := s.children[name]
	s.mu.Unlock()
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exited
}

// Done returns a channel closed when the named child's supervision ends
// (a NoRestart child exited, or the supervisor closed); nil for an
// unknown child.
func (s *Supervisor) Done(name string) <-chan struct{} {
	s.mu.Lock()
	c := s.children[name]
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.done
}

// Names lists the supervised children.
func (s *Supervisor) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.children))
	for n := range s.children {
		out = append(out, n)
	}
	return out
}

// Close stops every child (SIGTERM, SIGKILL after Grace) and waits for them.
func (s *Supervisor) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// tail returns up to n bytes from the end of a file.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(st.Size()-n, 0)
	b, _ := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	return string(b)
}

// errString is err's message, "" for nil (the exit record's err field).
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
