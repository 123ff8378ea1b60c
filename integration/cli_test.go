package integration

import (
	"strings"
	"testing"
	"time"
)

// The command-line contract's error paths: no deployment is started.
func TestCLIContractErrors(t *testing.T) {
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"help"}, 0, "demo"},
		{[]string{}, 2, "usage"},
		{[]string{"frobnicate"}, 2, "unknown command"},
		{[]string{"chaos", "--service", "ap", "--mode", "replay", "--checkpoint-every", "-1"}, 2, "must be positive"},
		{[]string{"chaos", "--service", "ap", "--kinds", "router"}, 2, "unknown kind"},
		{[]string{"chaos", "--service", "nope"}, 2, "unknown"},
		{[]string{"demo", "--kill", "standby-sidecar:ap-route@1s", "--duration", "2s"}, 2, "no hot standby"},
		{[]string{"demo", "--kill", "replica:ap-route@1s"}, 2, "unknown role"},
		{[]string{"demo", "--mode", "replay", "--checkpoint-every", "2000000"}, 2, "out of range"},
		{[]string{"demo", "--mode", "paxos"}, 2, "unknown mode"},
		{[]string{"demo", "--service", "nope"}, 2, "unknown"},
		{[]string{"demo", "--kill", "sidecar@1s"}, 2, "needs a model"},
		{[]string{"demo", "--kill", "sidecar:x"}, 2, "ROLE:MODEL@AFTER"},
		{[]string{"demo", "--kill", "sidecar:nope@1s", "--duration", "2s"}, 2, "not in service"},
		{[]string{"demo", "--kill", "frontend@5s", "--duration", "2s"}, 2, "not before the end"},
		{[]string{"up"}, 2, "--config is required"},
		{[]string{"demo", "--mode", "bare", "--kill", "backup-sidecar:ap-route@1s", "--duration", "2s"}, 2, "has no backup"},
		{[]string{"up", "--config", "/nonexistent.yaml"}, 2, "read config"},
		{[]string{"bench", "--modes", "direct,foo"}, 2, "unknown mode"},
		{[]string{"bench", "--batch", "0"}, 2, "--batch"},
		{[]string{"sidecar", "--config", "../examples/ap.yaml"}, 2, "--model and --manager"},
		{[]string{"sidecar", "--config", "../examples/ap.yaml", "--model", "ap-drive", "--manager", "127.0.0.1:1", "--role", "backup", "--insecure"}, 2, "is not replicated"},
		{[]string{"sidecar", "--config", "../examples/ap.yaml", "--model", "ap-route", "--manager", "127.0.0.1:1", "--insecure"}, 2, "--nats is required"},
		{[]string{"frontend", "--config", "../examples/ap.yaml", "--manager", "127.0.0.1:1", "--insecure"}, 2, "--nats is required"},
		{[]string{"modelserver", "--config", "../examples/ap.yaml", "--models", "nope", "--insecure"}, 2, "not in deployment"},
		{[]string{"manager", "--config", "../examples/ap.yaml", "--log-level", "loud"}, 2, "--log-level"},
		// Secure by default: a role without its certificate does not start.
		{[]string{"manager", "--config", "../examples/ap.yaml"}, 2, "--tls-cert"},
		{[]string{"sidecar", "--config", "../examples/ap.yaml", "--model", "ap-route", "--manager", "127.0.0.1:1", "--nats", "nats://127.0.0.1:1"}, 2, "--insecure"},
		{[]string{"manager", "--config", "../examples/ap.yaml", "--insecure", "--tls-cert", "x.crt"}, 2, "exclude each other"},
		{[]string{"modelserver", "--config", "../examples/ap.yaml", "--models", "ap-route", "--tls-cert", "/nonexistent.crt", "--tls-key", "/nonexistent.key", "--tls-ca", "/nonexistent.ca"}, 2, "nonexistent"},
		{[]string{"certs"}, 2, "--deployment or --config"},
		{[]string{"certs", "--deployment", "d", "--identity", "x=king"}, 2, "unknown role"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, "_"), func(t *testing.T) {
			r := runHams(t, 20*time.Second, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stdout+r.stderr, tc.want) {
				t.Fatalf("exit %d (want %d), output lacks %q:\nstdout: %s\nstderr: %s", r.code, tc.code, tc.want, r.stdout, r.stderr)
			}
		})
	}
}
