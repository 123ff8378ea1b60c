package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/natsd"
)

// WaitReplayCheckpointed waits, in replay mode, until every stateful
// model's newest checkpoint covers everything its input log holds of the
// checkpoint's epoch or later (the primaries checkpoint their tail once
// idle), so the durable audit records are written before the processes
// are stopped; it polls the store until timeout and reports what it saw.
func WaitReplayCheckpointed(ctx context.Context, d *Deployment, timeout time.Duration) error {
	var models []string
	for i := range d.Config.Models {
		if d.Config.Replays(&d.Config.Models[i]) {
			models = append(models, d.Config.Models[i].Name)
		}
	}
	if len(models) == 0 || d.NATS == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// The operator's (admin) NATS user reads the replay store; it may
	// not create it (BindReplay).
	var cl *natsd.Client
	if d.natsAuth != "" {
		var err error
		if cl, err = natsd.LoadClient(d.natsAuth, natsd.Identity{Role: natsd.RoleAdmin, Deployment: d.Config.Name}, d.pki.adminSource().ClientConfig()); err != nil {
			return err
		}
	}
	co, nc, err := OpenCoordAuth(ctx, d.NATS, d.Config.Name, "chaos", cl, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	defer nc.Close()
	store, err := co.BindReplay(ctx)
	if err != nil {
		return err
	}
	pending := func(model string) (string, error) {
		ck, _, err := store.LoadCheckpoint(ctx, model)
		if errors.Is(err, coord.ErrNoCheckpoint) {
			return "no checkpoint", nil
		}
		if err != nil {
			return "", err
		}
		recs, err := store.Batches(ctx, model, ck.GetBatchId())
		if err != nil {
			return "", err
		}
		n := 0
		for _, r := range recs {
			if r.GetEpoch() >= ck.GetEpoch() {
				n++
			}
		}
		if n > 0 {
			return fmt.Sprintf("%d logged batches after checkpoint %d", n, ck.GetBatchId()), nil
		}
		return "", nil
	}
	for {
		var left []string
		for _, m := range models {
			why, err := pending(m)
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("replay store of %s: %w", m, err)
			}
			if why != "" || err != nil {
				left = append(left, m+": "+why)
			}
		}
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not every logged batch is checkpointed after %v: %v", timeout, left)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
