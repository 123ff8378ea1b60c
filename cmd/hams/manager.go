package main

import (
	"context"
	"os"

	"github.com/hams-go/hams/internal/agent"
	"github.com/hams-go/hams/internal/harness"
	"github.com/hams-go/hams/manager"
)

// runManager is `hams manager`: its flags, then the library call that does the work.
func runManager(args []string) error {
	rf := newRoleFlags("manager")
	natsURL := rf.fs.String("nats", "", "external NATS URL (JetStream enabled); empty starts an embedded nats-server")
	natsListen := rf.fs.String("nats-listen", manager.DefaultNATSListen, "client address of the embedded nats-server (port -1: random)")
	store := rf.fs.String("store", "", "JetStream store directory of the embedded server (empty: a temporary one)")
	hb := rf.fs.Duration("heartbeat-interval", manager.DefaultHeartbeatInterval, "heartbeat interval components are asked to keep")
	suspicion := rf.fs.Duration("suspicion-timeout", manager.DefaultSuspicionTimeout, "silence after which a component is declared dead")
	starter := rf.fs.String("starter", "", "URL of the instance agent that starts new backups and standbys for recovery (POST, see starter.go); empty: recovery cannot restore redundancy")
	id := rf.fs.String("id", "", "name of this manager in the active-manager lease (default <hostname>@<gRPC address>, so a manager restarted on its address takes its lease back at once)")
	var na natsAuthFlags
	na.register(rf.fs)
	leaseTTL := rf.fs.Duration("lease-ttl", manager.DefaultLeaseTTL, "active-manager lease lifetime (a standby manager takes over after this much silence)")
	dashAddr := rf.fs.String("dashboard", "", "serve the live, read-only dashboard (plain HTTP) on this address, e.g. 127.0.0.1:8080 (empty: none; docs/dashboard.md)")
	if err := rf.parse(args); err != nil {
		return err
	}
	r, err := setupRole("manager", rf)
	if err != nil {
		return err
	}
	nauth, err := na.managerAuth(r.dep.Name, r.tls, *natsURL != "")
	if err != nil {
		r.close()
		return err
	}
	var st manager.InstanceStarter
	if *starter != "" {
		hs, err := agent.NewClient(*starter, r.tls)
		if err != nil {
			r.close()
			return harness.Usagef("manager: --starter: %v", err)
		}
		st = hs
	}
	if *id == "" {
		host, _ := os.Hostname()
		*id = host + "@" + r.grpc.Addr().String()
	}
	dash, err := newManagerDashboard(*dashAddr, r.log)
	if err != nil {
		r.close()
		return err
	}
	m, err := manager.New(manager.Config{
		Events:            dash.sink(),
		Starter:           st,
		ID:                *id,
		LeaseTTL:          *leaseTTL,
		Deployment:        r.dep,
		GRPCListener:      r.grpc,
		NATSURL:           *natsURL,
		KVReplicas:        na.replicasFor(*natsURL),
		StoreDir:          *store,
		NATSListen:        *natsListen,
		HeartbeatInterval: *hb,
		SuspicionTimeout:  *suspicion,
		Logger:            r.log,
		Registry:          r.reg,
		TLS:               r.tls,
		NATSAuth:          nauth,
	})
	var run func(context.Context) error
	if err == nil {
		run, err = dash.run(m, r.dep, *id, r.log)
	}
	if err != nil {
		dash.close()
		r.close()
		return &harness.ExitError{Code: 2, Err: err}
	}
	return r.serve(run, m.Ready(), func() map[string]any {
		f := map[string]any{"nats": m.NATSClientURL(), "deployment": r.dep.Name}
		if a := dash.addr(); a != "" {
			f["dashboard"] = a
		}
		return f
	})
}
