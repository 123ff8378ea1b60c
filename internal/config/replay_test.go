package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestReplayDefaultsAndValidation(t *testing.T) {
	d, err := Parse([]byte(strings.Replace(good, "mode: bare", "mode: replay", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if d.Replay.CheckpointEvery != DefaultCheckpointEvery || d.Replay.CheckpointIdle.D() != DefaultCheckpointIdle {
		t.Fatalf("defaults %+v", d.Replay)
	}
	d, err = Parse([]byte(good + "replay: {checkpoint_every: 7, checkpoint_idle: 20ms}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if d.Replay.CheckpointEvery != 7 || d.Replay.CheckpointIdle.D() != 20*time.Millisecond {
		t.Fatalf("parsed %+v", d.Replay)
	}
	for _, c := range []struct{ yaml, want string }{
		{"replay: {checkpoint_every: -1}\n", "checkpoint_every -1"},
		{"replay: {checkpoint_every: 2000000}\n", "checkpoint_every 2000000"},
		{"replay: {checkpoint_idle: 10us}\n", "checkpoint_idle"},
		{"replay: {interval: 3}\n", "interval"},
	} {
		_, err := Parse([]byte(good + c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%q: error %v, want one mentioning %q", c.yaml, err, c.want)
		}
		if !strings.Contains(c.yaml, "interval") && !errors.Is(err, ErrInvalid) {
			t.Fatalf("%q: %v does not wrap ErrInvalid", c.yaml, err)
		}
	}
}
