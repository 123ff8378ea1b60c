package main

import (
	"context"

	"github.com/hams-go/hams/adapters/clipper/clipperstub"
	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/harness"
	"github.com/hams-go/hams/refserver/models"
)

// runClipperStub serves a Clipper query frontend's REST API for reference
// models of the deployment, one application per model named by its
// backend.model (adapters/clipper/clipperstub). It is test support, not
// Clipper: up, demo and bench run it as the backend of a clipper model
// that has no backend.address, and the bench's direct mode calls it over
// the same REST API the adapter uses.
func runClipperStub(args []string) error {
	rf := newPlainRoleFlags("clipper-stub")
	list := rf.fs.String("models", "", "comma-separated models of the deployment to serve as Clipper applications (required)")
	if err := rf.parse(args); err != nil {
		return err
	}
	names := cluster.SplitList(*list)
	if len(names) == 0 {
		return harness.Usagef("clipper-stub: --models is required")
	}
	r, err := setupRole("clipper-stub", rf)
	if err != nil {
		return err
	}
	apps := map[string]*clipperstub.App{}
	for _, n := range names {
		mc := r.dep.Model(n)
		if mc == nil {
			r.close()
			return harness.Usagef("clipper-stub: model %q is not in deployment %q", n, r.dep.Name)
		}
		m, err := models.New(mc)
		if err != nil {
			r.close()
			return &harness.ExitError{Code: 2, Err: err}
		}
		app, err := clipperstub.NewApp(m)
		if err != nil {
			r.close()
			return harness.Usagef("clipper-stub: %v", err)
		}
		apps[mc.Backend.Model] = app
	}
	lis := r.grpc
	r.grpc = nil
	r.fields["http"] = lis.Addr().String()
	delete(r.fields, "grpc")
	r.fields["models"] = names
	mux := clipperstub.Handler(apps)
	return r.serve(func(ctx context.Context) error { return grpcx.ServeHTTP(ctx, mux, lis) }, nil, nil)
}
