package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// Files names a component's certificate, its key and the CA that
// verifies its peers (PEM files; a CA file may hold several CAs while
// one is being rotated).
type Files struct {
	CA, Cert, Key string
}

// reloadEvery bounds how often a Source looks at its files' modification
// times (on a handshake, not from a goroutine of its own).
const reloadEvery = time.Second

// Source serves a component's certificate and CA pool from files and
// reloads them when a file changes (checked on a handshake, at most once
// per reloadEvery). A reload that fails (a half-rotated pair, a key that
// does not match) keeps the previous material and is reported by
// LastReloadError; the identity may not change across reloads.
type Source struct {
	files Files
	now   func() time.Time

	mu        sync.Mutex
	cert      *tls.Certificate
	pool      *x509.CertPool
	id        Identity
	mtimes    [3]time.Time
	checked   time.Time
	reloadErr error
	reloads   int
}

// Load reads files (this is I/O, unlike a component's New) and returns a
// Source for them.
func Load(f Files) (*Source, error) {
	if f.CA == "" || f.Cert == "" || f.Key == "" {
		return nil, fmt.Errorf("%w: certificate, key and CA files are all required (got cert %q, key %q, CA %q)", ErrIdentity, f.Cert, f.Key, f.CA)
	}
	s := &Source{files: f, now: time.Now}
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Source) stat() ([3]time.Time, error) {
	var m [3]time.Time
	for i, p := range []string{s.files.CA, s.files.Cert, s.files.Key} {
		fi, err := os.Stat(p)
		if err != nil {
			return m, fmt.Errorf("pki: %w", err)
		}
		m[i] = fi.ModTime()
	}
	return m, nil
}

// load reads the files; s.mu is held (or s is not shared yet).
func (s *Source) load() error {
	m, err := s.stat()
	if err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(s.files.Cert, s.files.Key)
	if err != nil {
		return fmt.Errorf("pki: load %s and %s: %w", s.files.Cert, s.files.Key, err)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("pki: parse %s: %w", s.files.Cert, err)
		}
		cert.Leaf = leaf
	}
	id, err := FromCertificate(leaf)
	if err != nil {
		return fmt.Errorf("pki: %s: %w", s.files.Cert, err)
	}
	if s.cert != nil && id.String() != s.id.String() {
		return fmt.Errorf("%w: %s now names %v, was %v (an identity does not change on reload)", ErrIdentity, s.files.Cert, id, s.id)
	}
	cab, err := os.ReadFile(s.files.CA)
	if err != nil {
		return fmt.Errorf("pki: read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cab) {
		return fmt.Errorf("pki: %s holds no PEM certificate", s.files.CA)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}, CurrentTime: s.now()}); err != nil {
		return fmt.Errorf("pki: %s is not valid under %s: %w", s.files.Cert, s.files.CA, err)
	}
	s.cert, s.pool, s.id, s.mtimes = &cert, pool, id, m
	return nil
}

// current returns the certificate and CA pool, reloading them first when
// a file changed.
func (s *Source) current() (*tls.Certificate, *x509.CertPool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if now.Sub(s.checked) >= reloadEvery {
		s.checked = now
		if m, err := s.stat(); err != nil {
			s.reloadErr = err
		} else if m != s.mtimes {
			if err := s.load(); err != nil {
				s.reloadErr = err
			} else {
				s.reloadErr = nil
				s.reloads++
			}
		}
	}
	return s.cert, s.pool
}

// Identity is the component's own identity.
func (s *Source) Identity() Identity {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id
}

// Files are the files s reads.
func (s *Source) Files() Files { return s.files }

// LastReloadError is the error of the last reload attempt (nil after a
// successful one), and how many reloads succeeded.
func (s *Source) LastReloadError() (error, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reloadErr, s.reloads
}

// VerifyPeer checks a peer's certificate chain against the current CA
// pool and returns the identity it names, which must belong to the same
// deployment as s.
func (s *Source) VerifyPeer(rawCerts [][]byte) (Identity, error) {
	_, pool := s.current()
	return verifyChain(rawCerts, pool, s.Identity().Deployment, s.now())
}

func verifyChain(rawCerts [][]byte, pool *x509.CertPool, deployment string, now time.Time) (Identity, error) {
	if len(rawCerts) == 0 {
		return Identity{}, fmt.Errorf("%w: the peer sent no certificate", ErrNoPeer)
	}
	certs := make([]*x509.Certificate, len(rawCerts))
	for i, b := range rawCerts {
		c, err := x509.ParseCertificate(b)
		if err != nil {
			return Identity{}, fmt.Errorf("%w: peer certificate %d: %v", ErrNoPeer, i, err)
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return Identity{}, fmt.Errorf("%w: %v", ErrNoPeer, err)
	}
	id, err := FromCertificate(certs[0])
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %v", ErrNoPeer, err)
	}
	if id.Deployment != deployment {
		return Identity{}, fmt.Errorf("%w: peer %v belongs to deployment %q, not %q", ErrNoPeer, id, id.Deployment, deployment)
	}
	return id, nil
}

func (s *Source) verify(rawCerts [][]byte, _ [][]*x509.Certificate) error {
	_, err := s.VerifyPeer(rawCerts)
	return err
}

// ServerConfig is the TLS configuration of an internal server: TLS 1.3,
// a client certificate required and verified against the CA, the peer's
// identity checked to be of this deployment (what it may call is the
// authorizer's business). nextProtos is set when given (gRPC sets h2).
func (s *Source) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAnyClientCert, // verified by VerifyPeerCertificate against the current CA pool
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c, _ := s.current()
			return c, nil
		},
		VerifyPeerCertificate: s.verify,
	}
}

// ClientConfig is the TLS configuration of an internal client: its
// certificate presented, the server verified against the CA and by
// identity (host names are not checked: internal addresses are loopback
// ports and pod IPs; the server's SPIFFE ID is).
func (s *Source) ClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // replaced by VerifyPeerCertificate: chain against the CA, then identity
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, _ := s.current()
			return c, nil
		},
		VerifyPeerCertificate: s.verify,
	}
}

// IdentityOf reads the verified peer identity of a TLS connection state
// (its chain was verified in the handshake by VerifyPeerCertificate).
func IdentityOf(cs tls.ConnectionState) (Identity, error) {
	if len(cs.PeerCertificates) == 0 {
		return Identity{}, fmt.Errorf("%w: the connection has no peer certificate", ErrNoPeer)
	}
	id, err := FromCertificate(cs.PeerCertificates[0])
	if err != nil {
		return Identity{}, errors.Join(ErrNoPeer, err)
	}
	return id, nil
}
