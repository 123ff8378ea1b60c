package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// Validity defaults: a CA for ten years, a component certificate for one
// (issue new ones with `hams certs`; files are reloaded when they change).
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultCertValidity = 365 * 24 * time.Hour
	// backdate covers clock skew between the issuer and the verifiers.
	backdate = 5 * time.Minute
)

// File names of a certificate directory.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// CA is a deployment's certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// CertPEM is Cert's PEM encoding (what verifiers are given).
	CertPEM []byte
}

// Pair is an issued certificate and its private key, PEM encoded.
type Pair struct {
	CertPEM, KeyPEM []byte
}

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("pki: serial number: %w", err)
	}
	return n, nil
}

// NewCA creates a self-signed CA (ECDSA P-256) named after deployment.
func NewCA(deployment string, now time.Time, validity time.Duration) (*CA, error) {
	if validity <= 0 {
		validity = DefaultCAValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "HAMS-Go CA " + deployment, Organization: []string{"HAMS-Go"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("pki: self-sign CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parse CA: %w", err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Issue signs a certificate for id, usable as both TLS server and client
// (every HAMS component is both). hosts become DNS or IP SANs, for
// clients that verify host names (NATS tools, curl); HAMS peers verify
// the identity instead.
func (ca *CA) Issue(id Identity, hosts []string, now time.Time, validity time.Duration) (*Pair, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	if validity <= 0 {
		validity = DefaultCertValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: key for %v: %w", id, err)
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: id.Role.String() + "/" + orDash(id.Model) + "/" + orDash(id.Instance), Organization: []string{"HAMS-Go " + id.Deployment}},
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{id.URI()},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: sign certificate for %v: %w", id, err)
	}
	kd, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("pki: encode key for %v: %w", id, err)
	}
	return &Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd}),
	}, nil
}

// writeFile writes b to path atomically (a temporary file renamed), so a
// process reloading the file never reads half of it.
func writeFile(path string, b []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	return nil
}

// Write stores the CA in dir as ca.crt and ca.key (0600).
func (ca *CA) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: certificate dir: %w", err)
	}
	kd, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return fmt.Errorf("pki: encode CA key: %w", err)
	}
	if err := writeFile(filepath.Join(dir, CACertFile), ca.CertPEM, 0o644); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, CAKeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd}), 0o600)
}

// LoadCA reads a CA written by Write.
func LoadCA(dir string) (*CA, error) {
	cb, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("pki: read CA: %w", err)
	}
	kb, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("pki: read CA key: %w", err)
	}
	cert, err := parseCert(cb)
	if err != nil {
		return nil, fmt.Errorf("pki: CA %s: %w", filepath.Join(dir, CACertFile), err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("pki: %s is not a CA certificate", filepath.Join(dir, CACertFile))
	}
	blk, _ := pem.Decode(kb)
	if blk == nil {
		return nil, fmt.Errorf("pki: %s: no PEM block", filepath.Join(dir, CAKeyFile))
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", filepath.Join(dir, CAKeyFile), err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("pki: %s: not a signing key", filepath.Join(dir, CAKeyFile))
	}
	return &CA{Cert: cert, Key: signer, CertPEM: cb}, nil
}

// LoadOrCreateCA loads dir's CA, creating one when dir has none.
func LoadOrCreateCA(dir, deployment string, now time.Time) (*CA, error) {
	ca, err := LoadCA(dir)
	if err == nil {
		return ca, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if ca, err = NewCA(deployment, now, 0); err != nil {
		return nil, err
	}
	if err := ca.Write(dir); err != nil {
		return nil, err
	}
	return ca, nil
}

// Write stores p as dir/<name>.crt and dir/<name>.key (0600) and returns
// the files, with dir's ca.crt as the CA.
func (p *Pair) Write(dir, name string) (Files, error) {
	f := Files{CA: filepath.Join(dir, CACertFile), Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key")}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Files{}, fmt.Errorf("pki: certificate dir: %w", err)
	}
	if err := writeFile(f.Cert, p.CertPEM, 0o644); err != nil {
		return Files{}, err
	}
	if err := writeFile(f.Key, p.KeyPEM, 0o600); err != nil {
		return Files{}, err
	}
	return f, nil
}

func parseCert(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no CERTIFICATE PEM block")
	}
	return x509.ParseCertificate(blk.Bytes)
}

// IssueFiles issues a certificate for id and writes it as dir/<name>.crt
// and .key next to the CA's ca.crt (which it writes too, if missing).
func (ca *CA) IssueFiles(dir, name string, id Identity, hosts []string, now time.Time) (Files, error) {
	p, err := ca.Issue(id, hosts, now, 0)
	if err != nil {
		return Files{}, err
	}
	if _, err := os.Stat(filepath.Join(dir, CACertFile)); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return Files{}, fmt.Errorf("pki: certificate dir: %w", err)
		}
		if err := writeFile(filepath.Join(dir, CACertFile), ca.CertPEM, 0o644); err != nil {
			return Files{}, err
		}
	}
	return p.Write(dir, name)
}
