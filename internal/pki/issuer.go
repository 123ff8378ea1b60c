package pki

import (
	"fmt"
	"sync"
	"time"
)

// Issuer issues the certificates of the processes one supervisor starts
// for a deployment (`hams up|demo|chaos|bench`): each name once, into
// dir next to the CA's ca.crt; only the Issuer holds the CA key.
type Issuer struct {
	dir, deployment string
	hosts           []string
	ca              *CA

	mu     sync.Mutex
	issued map[string]Files
}

// NewIssuer loads dir's CA, creating it when missing (I/O). hosts become
// every certificate's DNS/IP SANs.
func NewIssuer(dir, deployment string, hosts []string) (*Issuer, error) {
	ca, err := LoadOrCreateCA(dir, deployment, time.Now())
	if err != nil {
		return nil, err
	}
	return &Issuer{dir: dir, deployment: deployment, hosts: hosts, ca: ca, issued: map[string]Files{}}, nil
}

// Files issues the certificate of id under file name (the first time a
// name is asked for; later calls return the same files). The deployment
// is filled in.
func (i *Issuer) Files(name string, id Identity) (Files, error) {
	id.Deployment = i.deployment
	i.mu.Lock()
	defer i.mu.Unlock()
	if f, ok := i.issued[name]; ok {
		return f, nil
	}
	f, err := i.ca.IssueFiles(i.dir, name, id, i.hosts, time.Now())
	if err != nil {
		return Files{}, fmt.Errorf("certificate of %s: %w", name, err)
	}
	i.issued[name] = f
	return f, nil
}

// Source is Files loaded as a Source.
func (i *Issuer) Source(name string, id Identity) (*Source, error) {
	f, err := i.Files(name, id)
	if err != nil {
		return nil, err
	}
	return Load(f)
}
