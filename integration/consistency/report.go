package consistency

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Summary is a human report: the verdict, the counts, per-model durable
// history and the example issues.
func (r *Report) Summary() string {
	var b strings.Builder
	verdict := "CONSISTENT"
	if !r.OK() {
		verdict = "VIOLATED"
	}
	fmt.Fprintf(&b, "global consistency: %s: conflicts %d, lost %d, duplicates %d, not durable %d\n",
		verdict, r.Conflicts, r.Lost, r.Duplicates, r.NotDurable)
	fmt.Fprintf(&b, "  read %d durable records (%d files), %d reply records (%d files) for %d req_ids; %d accepted, %d replies unmatched; quiescent %v\n",
		r.DurableRecords, r.DurableFiles, r.ReplyRecords, r.ReplyFiles, r.Replies, r.Accepted, r.Unmatched, r.Quiescent)
	for _, m := range slices.Sorted(maps.Keys(r.Models)) {
		st := r.Models[m]
		fmt.Fprintf(&b, "  model %s: %d durable records, %d seqs (%d..%d, %d missing, %d repeated), %d forks; %d reply steps, %d not durable\n",
			m, st.DurableRecords, st.Seqs, st.MinSeq, st.MaxSeq, st.Missing, st.Repeats, st.Forks, st.ReplySteps, st.NotDurable)
	}
	if len(r.TornLines) > 0 {
		fmt.Fprintf(&b, "  skipped %d crash-torn final lines: %s\n", len(r.TornLines), strings.Join(r.TornLines, ", "))
	}
	for _, k := range slices.Sorted(maps.Keys(r.ByKind)) {
		n := r.ByKind[k]
		tag := ""
		if conflictKind(k, r.Quiescent) {
			tag = " (conflict)"
		}
		fmt.Fprintf(&b, "  %s%s: %d\n", k, tag, n)
		shown := 0
		for _, i := range r.Examples {
			if i.Kind == k {
				fmt.Fprintf(&b, "    %s\n", i)
				shown++
			}
		}
		if shown < n {
			fmt.Fprintf(&b, "    ... and %d more\n", n-shown)
		}
	}
	return b.String()
}

// WriteJSON writes the report as indented JSON to path, replacing it
// atomically (temporary file in the same directory, then rename).
func WriteJSON(r *Report, path string) error {
	if r == nil {
		return fmt.Errorf("consistency: write report to %s: nil report", path)
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("consistency: encode report: %w", err)
	}
	data = append(data, '\n')
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("consistency: write report %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("consistency: write report %s: %w", path, err)
	}
	return nil
}
