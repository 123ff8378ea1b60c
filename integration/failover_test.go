package integration

import (
	"testing"
)

// Frontend kills under load (hams chaos --kinds frontend: the leading
// frontend, which injects every request and receives the sink edges, and
// any frontend process). Clients spread over the two frontends and retry
// on the other one, with the same request_id, when theirs dies. Every
// accepted request is answered exactly once (nothing lost, no request
// with two different replies), what a client received is what the
// frontend audited (client-mismatch is a conflict), re-asking answered
// requests on the other frontend gives the same reply, and the
// consistency checker passes.
func TestChaosFrontendKills(t *testing.T) {
	c := runChaos(t, "ap", "frontend", "10s", "3", 2)
	leading := 0
	for _, k := range c.Kills {
		if k.Kind != "frontend" {
			t.Fatalf("kill %+v is not a frontend kill", k)
		}
		if k.Note == "leading" {
			leading++
		}
	}
	switch {
	case c.Frontends != 2:
		t.Fatalf("%d frontends, want 2", c.Frontends)
	case leading == 0:
		t.Fatalf("no leading frontend was killed: %+v", c.Kills)
	case *c.Duplicates > leading:
		// A leading frontend audits an answer before it records it (so
		// no released reply lacks its record); killed right between, the
		// next leader's identical answer is a second record (same digest,
		// never a conflict): at most one per leading kill, usually none.
		t.Fatalf("%d duplicate reply records after %d leading-frontend kills", *c.Duplicates, leading)
	case c.Errors != 0:
		t.Fatalf("%d requests failed (a retry on the surviving frontend should have answered them)", c.Errors)
	case c.Retried == 0:
		t.Fatal("no request was retried on another frontend: the kills did not hit requests in flight")
	case c.Reasked < c.Retried || c.ReaskMismatches != 0:
		t.Fatalf("re-asked %d (retried %d), %d answered differently", c.Reasked, c.Retried, c.ReaskMismatches)
	}
	t.Logf("%d frontend kills (%d leading), %d requests retried on the other frontend, %d re-asked", len(c.Kills), leading, c.Retried, c.Reasked)
}

// Manager kills: the coordination engine runs in its own process, so a
// SIGKILL of the active manager loses no durability or completion notice;
// the standby takes the lease over (the killed one is restarted in place
// and stands by), components follow it, and nothing is lost.
func TestChaosManagerKill(t *testing.T) {
	c := runChaos(t, "ap", "manager", "8s", "5", 1)
	if c.Managers != 2 || *c.Duplicates != 0 || c.Errors != 0 {
		t.Fatalf("managers %d, duplicates %d, errors %d", c.Managers, *c.Duplicates, c.Errors)
	}
	for _, k := range c.Kills {
		if k.Kind != "manager" || k.Note != "active" {
			t.Fatalf("kill %+v: want the active manager", k)
		}
		if k.NewActive == "" || k.NewActive == k.Process {
			t.Fatalf("kill of %s: the manager active afterwards is %q, want the standby", k.Process, k.NewActive)
		}
	}
}
