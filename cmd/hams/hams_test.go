package main

import (
	"testing"
)

func TestDispatch(t *testing.T) {
	if dispatch([]string{"nope"}) != 2 || dispatch(nil) != 2 {
		t.Fatal("bad command exit codes")
	}
	if dispatch([]string{"chaos", "--mode", "replay", "--checkpoint-every", "-1"}) != 2 || dispatch([]string{"chaos", "--kinds", "router"}) != 2 || dispatch([]string{"chaos", "--frontends", "-1"}) != 2 ||
		dispatch([]string{"chaos", "--settle", "0s"}) != 2 {
		t.Fatal("chaos must refuse a negative checkpoint interval, unknown kinds and a zero settle time")
	}
	for _, args := range [][]string{
		{"demo", "--mode", "replay", "--checkpoint-every", "2000000"}, {"demo", "--mode", "zab"},
		{"sidecar", "--config", "x.yaml", "--model", "m", "--manager", "127.0.0.1:1", "--role", "witness"},
		{"modelserver", "--config", "x.yaml", "--models", "m", "--role", "witness"},
		{"sidecar", "--config", "x.yaml", "--model", "m", "--manager", "127.0.0.1:1", "--output-log-bytes", "-1"},
	} {
		if dispatch(args) != 2 {
			t.Errorf("%v: want exit 2", args)
		}
	}
}
