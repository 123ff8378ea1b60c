package natsd

import (
	"crypto/tls"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// maxSeedFile bounds a seed file read (a seed is 58 characters).
const maxSeedFile = 4 << 10

// Client is a component's NATS credentials: the nkey of its identity and,
// for a server with TLS, its client TLS configuration.
type Client struct {
	id  Identity
	kp  nkeys.KeyPair
	pub string
	tls *tls.Config
}

// LoadClient reads id's seed from credentials directory dir (SeedFile).
// tlsCfg (nil: plaintext) verifies the server and presents the
// component's client certificate (pki.Source.ClientConfig).
func LoadClient(dir string, id Identity, tlsCfg *tls.Config) (*Client, error) {
	return LoadClientSeed(SeedFile(dir, id), id, tlsCfg)
}

// LoadClientSeed reads id's user seed from path (a seed, or a decorated
// .creds-style file). The file must not be readable or writable by group
// or others (GenerateCredentials writes 0600).
func LoadClientSeed(path string, id Identity, tlsCfg *tls.Config) (*Client, error) {
	if err := id.Validate(); err != nil {
		return nil, fmt.Errorf("natsd: credentials of %s: %w", id, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("natsd: seed of %s: %w", id, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: seed file %s of %s has mode %v (group or others may access it; want 0600)", ErrCredentials, path, id, st.Mode().Perm())
	}
	b, err := readBounded(path, maxSeedFile)
	if err != nil {
		return nil, fmt.Errorf("natsd: seed of %s: %w", id, err)
	}
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	wipe(b)
	if err != nil {
		return nil, fmt.Errorf("%w: seed file %s of %s: %v", ErrCredentials, path, id, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("%w: seed file %s of %s: %v", ErrCredentials, path, id, err)
	}
	return &Client{id: id, kp: kp, pub: pub, tls: tlsCfg}, nil
}

// Identity is whom the credentials belong to.
func (c *Client) Identity() Identity { return c.id }

// PublicKey is the user's public nkey (the server's users list it).
func (c *Client) PublicKey() string { return c.pub }

// Options are the nats.Connect options that authenticate as the identity:
// its nkey (the server's nonce signed by the seed, which never leaves the
// process), its inbox prefix (Identity.InboxPrefix, the only inbox its
// permissions let it subscribe to) and, when the credentials have TLS,
// TLS with its client certificate.
func (c *Client) Options() []nats.Option {
	opts := c.InProcessOptions()
	if c.tls != nil {
		opts = append(opts, nats.Secure(c.tls))
	}
	return opts
}

// InProcessOptions are Options without TLS, for a connection to an
// embedded server in the same process (nats.InProcessServer: no network,
// so nats-server does not require TLS on it; it still authenticates).
func (c *Client) InProcessOptions() []nats.Option {
	return []nats.Option{
		nats.Nkey(c.pub, c.kp.Sign),
		nats.CustomInboxPrefix(c.id.InboxPrefix()),
	}
}
