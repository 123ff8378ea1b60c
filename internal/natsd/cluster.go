package natsd

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/hams-go/hams/internal/pki"
)

// DefaultClusterName is the cluster name when Cluster.Name is empty.
const DefaultClusterName = "hams"

// Cluster joins a server to a JetStream cluster: every node has its own
// Config.Name (JetStream's server_name, unique in the cluster), the same
// Cluster.Name, a route port, and routes to the others. Streams and
// buckets are then replicated as their Replicas say (coord.Open, the
// manager's KVReplicas): with 3, a write is acknowledged once two nodes
// stored it, and any one node may die.
type Cluster struct {
	// Name is the cluster's name, the same on every node (default
	// DefaultClusterName).
	Name string
	// Listen is host:port of the route port (port -1: random).
	Listen string
	// Routes are the nats-route://host:port URLs of the nodes; this
	// node's own may be listed (nats-server skips a route to itself), so
	// every node can be given the same list.
	Routes []string
	// TLS of the route port, used at both ends of a route (a node dials
	// the routes it is given and accepts the others'): RouteTLS builds it
	// from the node's certificates. Nil: routes in plaintext, without
	// authentication (the insecure mode).
	TLS *tls.Config
}

func (c *Cluster) check() error {
	if _, _, err := splitListen(c.Listen); err != nil {
		return fmt.Errorf("%w: Cluster.Listen %q: %v", ErrConfig, c.Listen, err)
	}
	if strings.ContainsAny(c.Name, " \t") {
		return fmt.Errorf("%w: Cluster.Name %q has spaces", ErrConfig, c.Name)
	}
	for _, r := range c.Routes {
		u, err := url.Parse(r)
		if err != nil || u.Host == "" || (u.Scheme != "nats-route" && u.Scheme != "nats") {
			return fmt.Errorf("%w: route %q: want nats-route://host:port", ErrConfig, r)
		}
	}
	if t := c.TLS; t != nil {
		if t.ClientAuth != tls.RequireAndVerifyClientCert && !(t.ClientAuth == tls.RequireAnyClientCert && t.VerifyPeerCertificate != nil) {
			return fmt.Errorf("%w: Cluster.TLS.ClientAuth is %v without a verifier (a route must present a certificate the node verifies; use RouteTLS)", ErrConfig, t.ClientAuth)
		}
		if len(t.Certificates) == 0 && (t.GetCertificate == nil || t.GetClientCertificate == nil) {
			return fmt.Errorf("%w: Cluster.TLS must present a certificate as server and as client (use RouteTLS)", ErrConfig)
		}
		if t.InsecureSkipVerify && t.VerifyPeerCertificate == nil {
			return fmt.Errorf("%w: Cluster.TLS skips verification without a VerifyPeerCertificate", ErrConfig)
		}
	}
	return nil
}

func splitListen(listen string) (string, int, error) {
	h, p, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < -1 || n > 65535 {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return h, n, nil
}

// RouteTLS is the TLS configuration of a node's route port: mutual TLS
// with the node's own certificate at both ends (a node dials routes as a
// TLS client and accepts them as a TLS server, with this one
// configuration), the peer's chain verified against the deployment's CA
// (reloaded with src) and its identity required to be a NATS server of
// the deployment (pki.RoleNATS). That verification is the routes'
// authentication: a process without a NATS server certificate of the
// deployment cannot join the cluster. Host names are not checked (the
// SPIFFE identity is), as on every internal connection (pki.ClientConfig).
func RouteTLS(src *pki.Source) *tls.Config {
	sc, cc := src.ServerConfig(), src.ClientConfig()
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		ClientAuth:           tls.RequireAnyClientCert,
		GetCertificate:       sc.GetCertificate,
		GetClientCertificate: cc.GetClientCertificate,
		// Replaced by VerifyPeerCertificate: chain against the CA, then
		// the role (nats-server logs a warning about it; Logger mutes it).
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			id, err := src.VerifyPeer(raw)
			if err != nil {
				return err
			}
			if id.Role != pki.RoleNATS {
				return fmt.Errorf("%w: route peer %v is not a NATS server", pki.ErrNoPeer, id)
			}
			return nil
		},
	}
}

// routeInsecureWarning starts nats-server's warning for a route TLS
// configuration with InsecureSkipVerify, which RouteTLS sets because it
// verifies the chain and identity itself.
const routeInsecureWarning = "TLS certificate chain and hostname of solicited routes will not be verified"
