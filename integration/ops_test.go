package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// duplicateKey returns the first key that occurs twice in one object of
// the JSON value b (at any depth), or "".
func duplicateKey(b []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	var walk func() (string, error)
	walk = func() (string, error) {
		tok, err := dec.Token()
		if err != nil {
			return "", err
		}
		d, ok := tok.(json.Delim)
		if !ok {
			return "", nil
		}
		seen := map[string]bool{}
		for dec.More() {
			if d == '{' {
				k, err := dec.Token()
				if err != nil {
					return "", err
				}
				if seen[k.(string)] {
					return k.(string), nil
				}
				seen[k.(string)] = true
			}
			if dup, err := walk(); dup != "" || err != nil {
				return dup, err
			}
		}
		_, err = dec.Token() // the closing delimiter
		return "", err
	}
	return walk()
}

func TestDuplicateKey(t *testing.T) {
	for in, want := range map[string]string{
		`{"a":1,"b":{"c":2,"d":[{"e":1,"e":2}]}}`: "e",
		`{"model":"x","msg":"m","model":"x"}`:     "model",
		`{"a":{"a":{"a":1}},"b":[1,{"b":2}]}`:     "",
	} {
		if got, err := duplicateKey([]byte(in)); got != want || err != nil {
			t.Errorf("duplicateKey(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// checkLogs fails t for every line of the child logs under dir that is
// not a JSON object or has a key twice; it returns the lines checked.
func checkLogs(t *testing.T, dir string) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no child logs in %s (%v)", dir, err)
	}
	lines, bad := 0, 0
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 4<<20)
		for n := 1; sc.Scan(); n++ {
			lines++
			l := sc.Bytes()
			var obj map[string]any
			if err := json.Unmarshal(l, &obj); err != nil {
				bad++
				t.Errorf("%s:%d is not a JSON object (%v): %.200s", filepath.Base(f), n, err, l)
				continue
			}
			if k, err := duplicateKey(l); k != "" || err != nil {
				bad++
				t.Errorf("%s:%d has key %q twice (%v): %.300s", filepath.Base(f), n, k, err, l)
			}
			if bad > 20 {
				fh.Close()
				t.Fatalf("too many bad log lines")
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		fh.Close()
	}
	return lines
}

// Every line of every child log of a demo with a failover is one JSON
// object without a duplicate key (issue 19: a "model" twice, and a
// non-JSON first line of every log).
func TestChildLogsAreCleanJSON(t *testing.T) {
	dir := t.TempDir()
	r := runHams(t, 3*time.Minute, "demo", "--service", "ap", "--duration", "4s", "--kill", "sidecar:ap-motion@1500ms",
		"--run-dir", dir, "--keep")
	if r.code != 0 {
		t.Fatalf("demo exit %d; stderr:\n%s", r.code, r.stderr)
	}
	n := checkLogs(t, filepath.Join(dir, "logs"))
	t.Logf("%d log lines checked", n)
}

// hams up lists every child's metrics address in its ready line; the
// sidecars report their role as hams_sidecar_role, a replicated primary
// its output log bound and durability lag; the logs are clean JSON.
func TestUpListsMetricsAddresses(t *testing.T) {
	dir := t.TempDir()
	p := startHams(t, 90*time.Second, "up", "--config", "../examples/ap.yaml", "--run-dir", dir)
	raw, ok := p.ready["metrics"].(map[string]any)
	if !ok {
		t.Fatalf("ready line %v has no metrics object", p.ready)
	}
	metrics := map[string]string{}
	for k, v := range raw {
		metrics[k], _ = v.(string)
	}
	for _, want := range []string{"manager:0", "frontend:0", "sidecar:ap-inception", "sidecar:ap-motion", "backup-sidecar:ap-motion", "modelserver:ap-motion"} {
		if metrics[want] == "" {
			t.Errorf("ready line's metrics lack %s: %v", want, metrics)
		}
	}
	scrape := func(addr string) (string, error) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s", resp.Status)
		}
		return string(b), err
	}
	// want polls a child's metrics until they hold every line: the ready
	// line comes before every role is settled on a loaded machine (the
	// manager's lease, a backup's first snapshot).
	want := func(child string, lines ...string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			body, err := scrape(metrics[child])
			var missing []string
			for _, l := range lines {
				if !strings.Contains(body, l) {
					missing = append(missing, l)
				}
			}
			if err == nil && len(missing) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("%s /metrics (scrape error %v) lacks %q", child, err, missing)
				return
			}
			time.Sleep(100 * time.Millisecond) // polling the child's metrics
		}
	}
	want("sidecar:ap-inception", `hams_sidecar_role{model="ap-inception",role="primary"} 1`, `hams_sidecar_role{model="ap-inception",role="standby"} 0`)
	want("sidecar:ap-motion", `hams_sidecar_role{model="ap-motion",role="primary"} 1`,
		"hams_sidecar_output_log_limit_bytes{", "hams_sidecar_durability_lag_seconds{")
	want("backup-sidecar:ap-motion", `hams_sidecar_role{model="ap-motion",role="backup"} 1`, `hams_sidecar_role{model="ap-motion",role="primary"} 0`)
	want("standby-sidecar:ap-inception", `hams_sidecar_role{model="ap-inception",role="standby"} 1`)
	want("manager:0", "hams_manager_active 1")
	p.stop(t, 30*time.Second)
	n := checkLogs(t, filepath.Join(dir, "logs"))
	t.Logf("%d log lines checked; metrics of %d children", n, len(metrics))
}
