// Command hams-compose is the helper of the per-role docker compose
// deployment (docs/docker.md). It is built into the compose image
// (hams-go-compose, FROM the scratch image hams-go) beside /hams:
//
//	hams-compose gen --config examples/ap.yaml [--out docker-compose.yml]
//	    write the per-role compose file for a deployment
//	hams-compose init --config /examples/ap.yaml --dir /secrets --hosts a,b
//	    the one-shot init service: per-component certificates (hams certs)
//	    and the NATS nkey credentials (the users hams up writes), once
//	hams-compose pod ARGS...
//	    exec /hams ARGS; on a restart of the container (the restart policy
//	    brought it back) the instance joins as a new spare: --id gets a
//	    generation suffix and a model instance's --role becomes standby
//	hams-compose probe HOST:PORT
//	    exit 0 when a TCP connection succeeds (healthchecks: the image has
//	    no shell)
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/natsd"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: hams-compose gen|init|pod|probe ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "gen":
		err = runGen(os.Args[2:])
	case "init":
		err = runInit(os.Args[2:])
	case "pod":
		err = runPod(os.Args[2:])
	case "probe":
		err = runProbe(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want gen, init, pod or probe", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hams-compose:", err)
		os.Exit(1)
	}
}

// hamsBin is the hams binary in the image.
const hamsBin = "/hams"

// genFile keeps the number of starts of this container in its writable
// layer: it survives `docker restart` and a restart by the engine's
// policy, and is gone when the container is recreated (docker compose
// up --force-recreate, down/up).
const genFile = "/.hams-pod-starts"

// runPod execs hams with args, rewritten on a restart of the container.
func runPod(args []string) error {
	if len(args) == 0 {
		return errors.New("pod: no hams arguments")
	}
	gen := 0
	if b, err := os.ReadFile(genFile); err == nil {
		gen, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if err := os.WriteFile(genFile, []byte(strconv.Itoa(gen+1)), 0o644); err != nil {
		return fmt.Errorf("pod: record the start: %w", err)
	}
	if gen > 0 {
		args = restarted(args, gen)
		fmt.Fprintf(os.Stderr, "hams-compose pod: start %d of this container: %s\n", gen+1, strings.Join(args, " "))
	}
	return syscall.Exec(hamsBin, append([]string{hamsBin}, args...), os.Environ())
}

// restarted rewrites the command line of a container's gen-th restart.
// Every instance id gets the suffix .r<gen>: the manager never reuses an
// id it declared dead (a returning one is retired and told to exit). A
// model instance (sidecar, modelserver) joins as a spare (role standby):
// its old role was handed to another instance by recovery while it was
// down, and a standby is what the manager re-roles to restore redundancy.
func restarted(args []string, gen int) []string {
	out := slices.Clone(args)
	instance := len(out) > 0 && (out[0] == "sidecar" || out[0] == "modelserver")
	for i := 1; i+1 < len(out); i++ {
		switch out[i] {
		case "--id", "-id":
			out[i+1] += ".r" + strconv.Itoa(gen)
		case "--role", "-role":
			if instance {
				out[i+1] = config.RoleStandby.String()
			}
		}
	}
	return out
}

// runProbe dials a TCP address once.
func runProbe(args []string) error {
	if len(args) != 1 {
		return errors.New("probe: want HOST:PORT")
	}
	c, err := net.DialTimeout("tcp", args[0], 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// runInit issues the certificates and NATS credentials of a deployment
// into dir, once (a marker file makes a second run a no-op: running
// components keep their keys).
func runInit(args []string) error {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "deployment YAML (required)")
	dir := fs.String("dir", "/secrets", "directory of certs/ and nats-auth/")
	hosts := fs.String("hosts", "", "extra comma-separated SANs (the compose services' names are always included)")
	keepCAKey := fs.Bool("keep-ca-key", false, "leave the CA key in DIR/certs (by default it is removed once every certificate is issued: no component can mint identities)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cfgPath == "" {
		return errors.New("init: --config is required")
	}
	done := filepath.Join(*dir, ".initialized")
	if _, err := os.Stat(done); err == nil {
		fmt.Println("init: already initialized:", *dir)
		return nil
	}
	dep, err := config.Load(*cfgPath)
	if err != nil {
		return err
	}
	l, err := layoutOf(dep)
	if err != nil {
		return err
	}
	certs := filepath.Join(*dir, "certs")
	cmd := []string{"certs", "--config", *cfgPath, "--dir", certs}
	sans := append(l.hostNames(), "localhost", "127.0.0.1")
	if *hosts != "" {
		sans = append(sans, strings.Split(*hosts, ",")...)
	}
	cmd = append(cmd, "--hosts", strings.Join(sans, ","))
	for _, id := range l.identities() {
		cmd = append(cmd, "--identity", id)
	}
	c := exec.Command(hamsBin, cmd...)
	c.Stdout, c.Stderr = os.Stdout, os.Stderr
	if err := c.Run(); err != nil {
		return fmt.Errorf("init: hams certs: %w", err)
	}
	if !*keepCAKey {
		if err := os.Remove(filepath.Join(certs, "ca.key")); err != nil {
			return fmt.Errorf("init: remove the CA key: %w", err)
		}
	}
	// TODO(cli): `hams certs` has no NATS counterpart; the credentials
	// are the ones hams up writes (natsd.EnsureCredentials).
	models := make([]string, 0, len(dep.Models))
	for _, m := range dep.Models {
		models = append(models, m.Name)
	}
	slices.Sort(models)
	if _, err := natsd.EnsureCredentials(filepath.Join(*dir, "nats-auth"), dep.Name, models); err != nil {
		return fmt.Errorf("init: NATS credentials: %w", err)
	}
	fmt.Println("init: NATS credentials:", filepath.Join(*dir, "nats-auth"))
	return os.WriteFile(done, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644)
}
