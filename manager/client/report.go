package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// ErrNotRunning is returned by ReportBackup outside Run.
var ErrNotRunning = errors.New("client: not running")

// ErrNoSuchBackup is returned by ReportBackup when the topology names no
// live backup of the model at the address.
var ErrNoSuchBackup = errors.New("client: no live backup at that address")

// NewIncarnation returns a random process identity for
// RegisterRequest.Incarnation (128 bits, hex).
func NewIncarnation() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Incarnation is the incarnation this client registers with.
func (c *Client) Incarnation() string { return c.cfg.Registration.GetIncarnation() }

// SuspicionTimeout is the manager's suspicion timeout, as its last
// Register answer told it (0 before one, or from a manager that does not
// tell).
func (c *Client) SuspicionTimeout() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.suspicion
}

// ReportBackup reports to the manager this client follows that this
// component (a stateful model's primary sidecar) cannot ship to its
// backup at addr: Manager.ReportFailure with reporter = this component's
// id, suspect = the id the topology gives the live backup of model at
// addr. The manager replaces the backup (or refuses the report: the
// error then carries its gRPC status).
func (c *Client) ReportBackup(ctx context.Context, model, addr, reason string) error {
	c.mu.Lock()
	s, t := c.sess, c.topo
	c.mu.Unlock()
	if s == nil {
		return ErrNotRunning
	}
	suspect := ""
	for _, p := range t.GetPlacements() {
		if p.GetModel() == model && p.GetRole() == hamsv1.Role_ROLE_BACKUP && p.GetAlive() && p.GetSidecarAddress() == addr {
			suspect = p.GetComponentId()
		}
	}
	if suspect == "" {
		return fmt.Errorf("report backup %s of %s: %w", addr, model, ErrNoSuchBackup)
	}
	var err error
	for _, i := range s.targets() {
		_, err = s.apis[i].ReportFailure(ctx, &hamsv1.FailureReport{
			Reporter: c.cfg.Registration.GetId(), Suspect: suspect, Model: model, Reason: reason,
		})
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("report backup %s (%s) of %s: %w", suspect, addr, model, err)
}
