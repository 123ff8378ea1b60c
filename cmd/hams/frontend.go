package main

import (
	"context"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"

	"github.com/hams-go/hams/frontend"
	"github.com/hams-go/hams/internal/authz"
	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/harness"
	"github.com/hams-go/hams/internal/natsd"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/manager/client"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// runFrontend is `hams frontend`: its flags, then the library call that does the work.
func runFrontend(args []string) error {
	rf := newRoleFlags("frontend")
	mgr := rf.fs.String("manager", "", "manager gRPC address (required; comma-separated for an active manager and standbys: the frontend follows the active one)")
	httpAddr := rf.fs.String("http", "127.0.0.1:0", "HTTP/JSON API listen address")
	internalAddr := rf.fs.String("internal-listen", "", "internal gRPC listen address (Dataplane, Replication: the sidecars and the manager call it; it is the address registered in the topology); default: the host of --listen (loopback when that is a wildcard), a free port")
	natsURL := rf.fs.String("nats", "", "NATS URL of the coordination engine; required when the deployment replicates a stateful model, and with --request-log")
	var na natsAuthFlags
	na.register(rf.fs)
	audit := rf.fs.String("audit", "", "directory for JSONL audit logs (<dir>/<name>/replies.jsonl)")
	name := rf.fs.String("name", "", "name of this frontend in completion notices and its audit subdirectory (default frontend)")
	requestLog := rf.fs.Bool("request-log", false, "log every accepted request and record every answer in JetStream before it is released (needs --nats): several frontends then share the deployment, a surviving one completes what a dead one accepted, and a retried request_id gets the same reply on any frontend")
	if err := rf.parse(args); err != nil {
		return err
	}
	if *mgr == "" {
		return harness.Usagef("frontend: --manager is required")
	}
	if *requestLog && *natsURL == "" {
		return harness.Usagef("frontend: --request-log needs --nats (the log lives in JetStream)")
	}
	r, err := setupRole("frontend", rf)
	if err != nil {
		return err
	}
	hl, err := r.listen(*httpAddr, "HTTP")
	if err != nil {
		return err
	}
	if *internalAddr == "" {
		*internalAddr = internalListenDefault(r.grpc.Addr())
	}
	il, err := r.listen(*internalAddr, "internal gRPC")
	if err != nil {
		hl.Close()
		return err
	}
	closeAll := func() {
		r.close()
		hl.Close()
		il.Close()
	}
	// The topology names the frontend by its internal address: the sink
	// models' sidecars Forward to it, the manager calls Resend there.
	addr := il.Addr().String()
	mc, err := client.New(client.Config{ManagerAddrs: cluster.SplitList(*mgr), Logger: r.log, DialOptions: r.dialOpts(), Registration: &hamsv1.RegisterRequest{
		Kind: hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND, Id: "frontend/" + addr, Address: addr, Pid: int32(os.Getpid()), MetricsAddress: r.metricsAddr(),
	}})
	if err != nil {
		closeAll()
		return &harness.ExitError{Code: 2, Err: err}
	}
	fcfg := frontend.Config{
		Deployment:       r.dep,
		Resolver:         mc,
		GRPCListener:     r.grpc,
		InternalListener: il,
		HTTPListener:     hl,
		Logger:           r.log,
		Registry:         r.reg,
		Name:             *name,
		AuditDir:         *audit,
		Address:          addr,
		DialOptions:      r.dialOpts(),
	}
	if r.tls != nil {
		// The internal port: mutual TLS, and only the sink models'
		// sidecars may Forward, only managers Resend (internal/authz).
		self := r.tls.Identity()
		if self.Role != pki.RoleFrontend {
			closeAll()
			return harness.Usagef("frontend: certificate %v is not a frontend's", self)
		}
		az, err := authz.New(authz.Config{Self: self, Facts: authz.NewGraphFacts(r.dep, config.Frontend), Logger: r.log})
		if err != nil {
			closeAll()
			return &harness.ExitError{Code: 2, Err: err}
		}
		fcfg.InternalServerOptions = append([]grpc.ServerOption{grpcx.ServerTLS(r.tls)}, az.ServerOptions()...)
	}
	if r.dep.ClientAuth != nil {
		if fcfg.ClientAuth, err = frontend.NewClientAuth(r.dep.ClientAuth, r.log); err != nil {
			closeAll()
			return &harness.ExitError{Code: 2, Err: err}
		}
	}
	if r.dep.Coordinated() || *requestLog {
		if *natsURL == "" {
			closeAll()
			return harness.Usagef("frontend: deployment %q replicates stateful models (mode %s): --nats is required", r.dep.Name, r.dep.Mode)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cl, err := na.client(natsd.Identity{Role: natsd.RoleFrontend, Deployment: r.dep.Name}, r.tls)
		if err != nil {
			cancel()
			closeAll()
			return err
		}
		co, nc, err := cluster.OpenCoordReplicas(ctx, *natsURL, na.replicasFor(*natsURL), r.dep.Name, "frontend", cl, r.log)
		cancel()
		if err != nil {
			closeAll()
			return err
		}
		defer nc.Close()
		fcfg.Coord = co
		if *requestLog {
			fcfg.Log = co
		}
	}
	fe, err := frontend.New(fcfg)
	if err != nil {
		closeAll()
		return &harness.ExitError{Code: 2, Err: err}
	}
	r.fields["http"] = hl.Addr().String()
	r.fields["internal"] = addr
	return r.serve(func(ctx context.Context) error {
		g := newGroup(ctx)
		g.Go("frontend", fe.Run)
		g.Go("manager client", mc.Run)
		return g.Wait()
	}, nil, nil)
}

// internalListenDefault is the frontend's default --internal-listen: the
// host of its client gRPC address (loopback when that is a wildcard: the
// address is registered in the topology, where a wildcard cannot be
// dialed, and it is never offered beyond the host by default), a free
// port.
func internalListenDefault(client net.Addr) string {
	host := "127.0.0.1"
	if ta, ok := client.(*net.TCPAddr); ok && ta.IP != nil && !ta.IP.IsUnspecified() {
		host = ta.IP.String()
	}
	return net.JoinHostPort(host, "0")
}
