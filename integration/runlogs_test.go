package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// runLogExcerpt is what a failed chaos or demo run leaves to read in a CI
// log, where the run directory is gone: of the children's logs in
// runDir/logs, the lines of the last window before the newest line, at
// info level and above, from the managers and from the processes whose
// log name contains one of names (the models the report names as
// unrestored), at most perFile lines from each, oldest first. Each line
// is shortened to its time (seconds before the newest line), level,
// message and attributes.
func runLogExcerpt(runDir string, names []string, window time.Duration, perFile int) string {
	files, _ := filepath.Glob(filepath.Join(runDir, "logs", "*.log"))
	type line struct {
		at   time.Time
		text string
	}
	picked := map[string][]line{}
	var newest time.Time
	for _, f := range files {
		base := strings.TrimSuffix(filepath.Base(f), ".log")
		want := strings.HasPrefix(base, "manager_")
		for _, n := range names {
			want = want || strings.Contains(base, "_"+n)
		}
		if !want {
			continue
		}
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
		for sc.Scan() {
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) != nil {
				continue
			}
			ts, _ := rec["time"].(string)
			at, err := time.Parse(time.RFC3339Nano, ts)
			if err != nil || rec["level"] == "DEBUG" {
				continue
			}
			if at.After(newest) {
				newest = at
			}
			picked[base] = append(picked[base], line{at: at, text: compactLogLine(rec)})
		}
		fh.Close()
	}
	var b strings.Builder
	keys := make([]string, 0, len(picked))
	for k := range picked {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		var keep []line
		for _, l := range picked[k] {
			if newest.Sub(l.at) <= window {
				keep = append(keep, l)
			}
		}
		if len(keep) > perFile {
			keep = keep[len(keep)-perFile:]
		}
		if len(keep) == 0 {
			continue
		}
		fmt.Fprintf(&b, "--- %s\n", k)
		for _, l := range keep {
			fmt.Fprintf(&b, "  -%6.3fs %s\n", newest.Sub(l.at).Seconds(), l.text)
		}
	}
	return b.String()
}

// compactLogLine is a slog JSON record as "LEVEL msg k=v ...", at most
// 360 bytes.
func compactLogLine(rec map[string]any) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v %v", rec["level"], rec["msg"])
	keys := make([]string, 0, len(rec))
	for k := range rec {
		switch k {
		case "time", "level", "msg", "deployment", "component", "role", "model", "supervisor":
			continue
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%v", k, rec[k])
	}
	s := b.String()
	if len(s) > 360 {
		s = s[:360] + "…"
	}
	return s
}

func TestRunLogExcerptPicksTheLastSecondsOfTheSuspects(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
	rec := func(at time.Duration, level, msg string) string {
		b, _ := json.Marshal(map[string]any{"time": t0.Add(at).Format(time.RFC3339Nano), "level": level, "msg": msg, "epoch": 2})
		return string(b) + "\n"
	}
	write := func(name string, lines ...string) {
		if err := os.WriteFile(filepath.Join(dir, "logs", name), []byte(strings.Join(lines, "")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("manager_0.log", rec(0, "INFO", "too early"), rec(20*time.Second, "INFO", "recovery: promote"), "not json\n")
	write("sidecar_ap-motion.log", rec(25*time.Second, "DEBUG", "chatter"), rec(29*time.Second, "WARN", "stuck shipping"))
	write("sidecar_ap-drive.log", rec(30*time.Second, "ERROR", "not a suspect"))
	got := runLogExcerpt(dir, []string{"ap-motion"}, 12*time.Second, 40)
	for _, want := range []string{"--- manager_0", "INFO recovery: promote epoch=2", "--- sidecar_ap-motion", "- 0.000s WARN stuck shipping", "- 9.000s INFO recovery"} {
		if !strings.Contains(got, want) {
			t.Errorf("excerpt lacks %q:\n%s", want, got)
		}
	}
	for _, not := range []string{"too early", "chatter", "not a suspect", "not json"} {
		if strings.Contains(got, not) {
			t.Errorf("excerpt has %q:\n%s", not, got)
		}
	}
}
