package transcript

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const sample = `# lead comment
cmd a=1 b
  more input
----
out 1
out 2

# empty output
other
----

last x=y
----
done
`

func TestParse(t *testing.T) {
	cases, tail, err := Parse("f.txt", sample)
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) != 3 || len(tail) != 0 {
		t.Fatalf("%d cases, tail %q", len(cases), tail)
	}
	c := cases[0]
	if c.Pos != "f.txt:2" || c.Cmd != "cmd" || !reflect.DeepEqual(c.Args, []string{"a=1", "b"}) ||
		len(c.Lines) != 2 || c.Expected != "out 1\nout 2" {
		t.Fatalf("case 0: %+v", c)
	}
	if v, ok := Arg(c.Args, "a"); v != "1" || !ok {
		t.Fatalf("a=%q %v", v, ok)
	}
	if v, ok := Arg(c.Args, "b"); v != "" || !ok {
		t.Fatalf("b=%q %v", v, ok)
	}
	if _, ok := Arg(c.Args, "c"); ok {
		t.Fatal("c present")
	}
	if n, err := Uint(c.Args, "a", 9); n != 1 || err != nil {
		t.Fatalf("Uint a: %d %v", n, err)
	}
	if _, err := Uint([]string{"a=x"}, "a", 0); err == nil {
		t.Fatal("Uint of x: no error")
	}
	if cases[1].Expected != "" || cases[2].Expected != "done" {
		t.Fatalf("cases 1, 2: %q %q", cases[1].Expected, cases[2].Expected)
	}
	for _, bad := range []string{"cmd\n", "cmd\n\n----\n"} {
		if _, _, err := Parse("bad.txt", bad); err == nil {
			t.Errorf("Parse(%q): no error", bad)
		}
	}
}

// Run with -update rewrites only the outputs: comments, inputs and the
// blank lines between cases stay as they are.
func TestRunUpdateKeepsEverythingButOutputs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.txt")
	if err := os.WriteFile(path, []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	old := *update
	*update = true
	defer func() { *update = old }()
	Run(t, path, func(_ *testing.T, c *Case) string { return strings.ToUpper(c.Cmd) })
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.NewReplacer("out 1\nout 2\n", "CMD\n", "other\n----\n", "other\n----\nOTHER\n", "----\ndone\n", "----\nLAST\n").Replace(sample)
	if string(got) != want {
		t.Fatalf("rewritten:\n%s\nwant:\n%s", got, want)
	}
	*update = false
	Run(t, path, func(_ *testing.T, c *Case) string { return strings.ToUpper(c.Cmd) })
}
