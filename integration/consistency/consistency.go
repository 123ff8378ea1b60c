package consistency

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Kinds of Issue.
const (
	KindForked         = "forked-history"       // durable records of one (model, seq) disagree
	KindNotInHistory   = "reply-not-in-history" // a reply's stateful output is not the durable one
	KindNotDurable     = "not-durable"          // a reply's stateful step has no durable record
	KindReplyConflict  = "duplicate-conflict"   // one req_id answered with two different replies
	KindOutputConflict = "output-conflict"      // one stateful (model, seq) with two outputs across replies
	KindSeqShared      = "seq-shared"           // one stateful (model, seq) in replies to two requests
	KindClientMismatch = "client-mismatch"      // the client saw another reply than the one recorded
	KindDuplicate      = "duplicate"            // one req_id answered twice identically
	KindLost           = "lost"                 // an accepted request without reply
)

// DefaultMaxExamples is the number of issues of each kind a Report keeps
// when Options.MaxExamples is 0.
const DefaultMaxExamples = 10

// Accepted is a request the load generator got accepted by a frontend.
// ReqID is the frontend req_id (decimal, as in replies.jsonl), known when
// the client received a reply; ClientRequestID is the request_id the
// client sent. At least one must be set. Entries sharing a
// ClientRequestID are attempts of one request (client retries): it is lost
// when none of them has a reply record; an entry without ReqID therefore
// joins with nothing, so a client id whose attempts all lack a ReqID (the
// client never got a reply) is lost. ReplyDigest, optional, is the
// tensor.Digest of the reply's output tensors in reply order as the client
// received them; it must equal the recorded reply_digest.
type Accepted struct {
	ReqID           string `json:"req_id,omitempty"`
	ClientRequestID string `json:"client_request_id,omitempty"`
	ReplyDigest     string `json:"reply_digest,omitempty"`
}

// Options tune Check.
type Options struct {
	// Quiescent: the run drained before the logs were read (every backup
	// applied what it received), so a reply naming a stateful (model, seq)
	// without any durable record is a conflict. When false such steps are
	// only counted in NotDurable.
	Quiescent bool
	// Stateful names models that are stateful even if they wrote no durable
	// record (e.g. all backups of the model died, or it has none). Models
	// with durable records are always stateful.
	Stateful []string
	// MaxExamples bounds the issues kept per kind (0 = DefaultMaxExamples,
	// negative = all).
	MaxExamples int
}

// Issue is one violation (or one counted event such as a duplicate).
type Issue struct {
	Kind   string `json:"kind"`
	Model  string `json:"model,omitempty"`
	Seq    uint64 `json:"seq,omitempty"`
	ReqID  string `json:"req_id,omitempty"`
	Detail string `json:"detail"`
	// Sources are the file:line positions (relative to the audit dir) of
	// the records involved.
	Sources []string `json:"sources,omitempty"`
}

func (i Issue) String() string {
	s := i.Kind + ": " + i.Detail
	if len(i.Sources) > 0 {
		s += " [" + strings.Join(i.Sources, ", ") + "]"
	}
	return s
}

// ModelStats describes the durable history of one stateful model.
type ModelStats struct {
	// DurableRecords counts records; Seqs the distinct seqs among them.
	DurableRecords int    `json:"durable_records"`
	Seqs           int    `json:"seqs"`
	MinSeq         uint64 `json:"min_seq"`
	MaxSeq         uint64 `json:"max_seq"`
	// Missing is the number of seqs in 1..MaxSeq without a durable record
	// (informational: a new backup synced from a full state may not list
	// earlier requests).
	Missing uint64 `json:"missing"`
	// Repeats counts records beyond the first per seq (identical or not).
	Repeats int `json:"repeats"`
	// Forks counts seqs whose records disagree.
	Forks int `json:"forks"`
	// ReplySteps counts (req_id, seq) lineage steps of replies at this model.
	ReplySteps int `json:"reply_steps"`
	// NotDurable counts those steps with no durable record.
	NotDurable int `json:"not_durable"`
}

// Report is the result of Check.
type Report struct {
	Quiescent      bool `json:"quiescent"`
	DurableFiles   int  `json:"durable_files"`
	ReplyFiles     int  `json:"reply_files"`
	DurableRecords int  `json:"durable_records"`
	ReplyRecords   int  `json:"reply_records"`
	// Replies is the number of distinct req_ids with a reply record.
	Replies int `json:"replies"`
	// Accepted is the number of accepted requests (distinct client ids,
	// plus entries that name only a req_id).
	Accepted int `json:"accepted"`
	// Conflicts counts consistency violations (the conflict kinds, and
	// not-durable when Quiescent).
	Conflicts int `json:"conflicts"`
	Lost      int `json:"lost"`
	// Duplicates counts reply records beyond the first per (req_id,
	// reply_digest).
	Duplicates int `json:"duplicates"`
	// NotDurable counts reply lineage steps at stateful models without a
	// durable record (in Conflicts too when Quiescent).
	NotDurable int `json:"not_durable"`
	// Unmatched counts replied req_ids that no Accepted entry names (replies
	// the client did not see, e.g. after its deadline); informational.
	Unmatched int `json:"unmatched"`
	// ByKind counts issues per kind (all of them, not only the examples).
	ByKind map[string]int `json:"by_kind"`
	// Models holds the stats of every stateful model.
	Models map[string]*ModelStats `json:"models"`
	// Examples are the first issues of each kind, in a deterministic order.
	Examples []Issue `json:"examples"`
	// TornLines are crash-torn final lines that were skipped (file:line).
	TornLines []string `json:"torn_lines,omitempty"`
}

// OK reports whether the run is consistent and complete: no conflict and
// nothing lost (duplicates are allowed).
func (r *Report) OK() bool { return r.Conflicts == 0 && r.Lost == 0 }

// conflictKind reports whether issues of kind count in Conflicts.
func conflictKind(kind string, quiescent bool) bool {
	switch kind {
	case KindForked, KindNotInHistory, KindReplyConflict, KindOutputConflict, KindSeqShared, KindClientMismatch:
		return true
	case KindNotDurable:
		return quiescent
	}
	return false
}

// collector adds issues to a report, keeping examples per kind.
type collector struct {
	r   *Report
	max int
}

func (c *collector) add(i Issue) {
	n := c.r.ByKind[i.Kind]
	c.r.ByKind[i.Kind] = n + 1
	if c.max < 0 || n < c.max {
		c.r.Examples = append(c.r.Examples, i)
	}
	switch {
	case conflictKind(i.Kind, c.r.Quiescent):
		c.r.Conflicts++
	case i.Kind == KindLost:
		c.r.Lost++
	case i.Kind == KindDuplicate:
		c.r.Duplicates++
	}
	if i.Kind == KindNotDurable {
		c.r.NotDurable++
	}
}

// Check judges the audit logs under auditDir and the accepted requests,
// for a quiescent run (Options.Quiescent) with default options.
func Check(auditDir string, accepted []Accepted) (*Report, error) {
	return CheckWith(auditDir, accepted, Options{Quiescent: true})
}

// ms is a (model, seq) key.
type ms struct {
	model string
	seq   uint64
}

func (k ms) String() string { return fmt.Sprintf("model %q seq %d", k.model, k.seq) }

func cmpMS(a, b ms) int {
	return cmp.Or(cmp.Compare(a.model, b.model), cmp.Compare(a.seq, b.seq))
}

// variant is one distinct content of the durable records of a (model, seq).
type variant struct {
	in, out, state string
	srcs           []string
}

// used is how replies used one stateful (model, seq).
type used struct {
	outputs []string          // distinct output digests, first-seen order
	outSrc  map[string]string // output digest -> first source
	reqs    []string          // distinct req_ids, first-seen order
	reqSrc  map[string]string // req_id -> first source
}

// CheckWith is Check with explicit options.
func CheckWith(auditDir string, accepted []Accepted, opts Options) (*Report, error) {
	for i, a := range accepted {
		if a.ReqID == "" && a.ClientRequestID == "" {
			return nil, fmt.Errorf("%w: entry %d names neither req_id nor client_request_id", ErrAccepted, i)
		}
		if a.ReplyDigest != "" && a.ReqID == "" {
			return nil, fmt.Errorf("%w: entry %d (client id %q) has a reply digest but no req_id", ErrAccepted, i, a.ClientRequestID)
		}
	}
	rs, err := readDir(auditDir)
	if err != nil {
		return nil, err
	}
	r := &Report{
		Quiescent: opts.Quiescent, DurableFiles: rs.durableFiles, ReplyFiles: rs.replyFiles,
		DurableRecords: len(rs.durable), ReplyRecords: len(rs.replies),
		ByKind: map[string]int{}, Models: map[string]*ModelStats{}, Examples: []Issue{}, TornLines: rs.torn,
	}
	c := &collector{r: r, max: opts.MaxExamples}
	if c.max == 0 {
		c.max = DefaultMaxExamples
	}

	// Rule 1: one linear durable history per model.
	hist := map[ms][]*variant{}
	for _, d := range rs.durable {
		k := ms{d.Model, d.Seq}
		st := r.Models[d.Model]
		if st == nil {
			st = &ModelStats{MinSeq: d.Seq}
			r.Models[d.Model] = st
		}
		st.DurableRecords++
		vs, seen := hist[k]
		if !seen {
			st.Seqs++
			st.MinSeq = min(st.MinSeq, d.Seq)
			st.MaxSeq = max(st.MaxSeq, d.Seq)
		} else {
			st.Repeats++
		}
		found := false
		for _, v := range vs {
			if v.in == d.InputDigest && v.out == d.OutputDigest && v.state == d.StateDigest {
				v.srcs = append(v.srcs, d.src)
				found = true
				break
			}
		}
		if !found {
			hist[k] = append(vs, &variant{in: d.InputDigest, out: d.OutputDigest, state: d.StateDigest, srcs: []string{d.src}})
		}
	}
	for _, name := range opts.Stateful {
		if r.Models[name] == nil {
			r.Models[name] = &ModelStats{}
		}
	}
	for _, st := range r.Models {
		st.Missing = st.MaxSeq - uint64(st.Seqs)
	}
	for _, k := range slices.SortedFunc(maps.Keys(hist), cmpMS) {
		vs := hist[k]
		if len(vs) < 2 {
			continue
		}
		r.Models[k.model].Forks++
		v0 := vs[0]
		var parts []string
		srcs := []string{v0.srcs[0]}
		for _, v := range vs[1:] {
			parts = append(parts, fmt.Sprintf("%s vs %s", v0.srcs[0], diffVariant(v0, v)))
			srcs = append(srcs, v.srcs[0])
		}
		c.add(Issue{Kind: KindForked, Model: k.model, Seq: k.seq, Sources: srcs,
			Detail: fmt.Sprintf("%s: durable history forked: %d different records: %s", k, len(vs), strings.Join(parts, "; "))})
	}

	// Rules 2 and 3: replies, grouped by req_id in first-seen order.
	byReq := map[string][]repRec{}
	var reqOrder []string
	for _, rp := range rs.replies {
		if _, ok := byReq[rp.ReqID]; !ok {
			reqOrder = append(reqOrder, rp.ReqID)
		}
		byReq[rp.ReqID] = append(byReq[rp.ReqID], rp)
	}
	r.Replies = len(reqOrder)
	slices.SortFunc(reqOrder, cmpReqID)
	uses := map[ms]*used{}
	for _, id := range reqOrder {
		recs := byReq[id]
		// Distinct reply digests, first-seen order.
		digests := []string{}
		dsrc := map[string]string{}
		for _, rp := range recs {
			if _, ok := dsrc[rp.ReplyDigest]; ok {
				c.add(Issue{Kind: KindDuplicate, ReqID: id, Sources: []string{dsrc[rp.ReplyDigest], rp.src},
					Detail: fmt.Sprintf("req_id %s answered twice with the same reply %s", id, short(rp.ReplyDigest))})
				continue
			}
			dsrc[rp.ReplyDigest] = rp.src
			digests = append(digests, rp.ReplyDigest)
		}
		if len(digests) > 1 {
			var ds, srcs []string
			for _, d := range digests {
				ds = append(ds, short(d))
				srcs = append(srcs, dsrc[d])
			}
			c.add(Issue{Kind: KindReplyConflict, ReqID: id, Sources: srcs,
				Detail: fmt.Sprintf("req_id %s answered with %d different replies: %s", id, len(digests), strings.Join(ds, " vs "))})
		}
		// Stateful lineage steps of this request, each (model, seq, output) once.
		type step struct {
			k   ms
			out string
		}
		seen := map[step]bool{}
		seenMS := map[ms]bool{}
		for _, rp := range recs {
			for _, s := range rp.Lineage {
				k := ms{s.Model, s.Seq}
				st := r.Models[s.Model]
				if st == nil {
					continue // stateless
				}
				sk := step{k, s.OutputDigest}
				if seen[sk] {
					continue
				}
				seen[sk] = true
				u := uses[k]
				if u == nil {
					u = &used{outSrc: map[string]string{}, reqSrc: map[string]string{}}
					uses[k] = u
				}
				if _, ok := u.outSrc[s.OutputDigest]; !ok {
					u.outSrc[s.OutputDigest] = rp.src
					u.outputs = append(u.outputs, s.OutputDigest)
				}
				if _, ok := u.reqSrc[id]; !ok {
					u.reqSrc[id] = rp.src
					u.reqs = append(u.reqs, id)
				}
				firstMS := !seenMS[k]
				seenMS[k] = true
				if firstMS {
					st.ReplySteps++
				}
				vs := hist[k]
				if len(vs) == 0 {
					if firstMS {
						st.NotDurable++
						c.add(Issue{Kind: KindNotDurable, Model: k.model, Seq: k.seq, ReqID: id, Sources: []string{rp.src},
							Detail: fmt.Sprintf("req_id %s: reply names %s (output %s), which has no durable record", id, k, short(s.OutputDigest))})
					}
					continue
				}
				if !slices.ContainsFunc(vs, func(v *variant) bool { return v.out == s.OutputDigest }) {
					c.add(Issue{Kind: KindNotInHistory, Model: k.model, Seq: k.seq, ReqID: id, Sources: []string{rp.src, vs[0].srcs[0]},
						Detail: fmt.Sprintf("req_id %s: reply's output at %s is %s, the durable history has %s",
							id, k, short(s.OutputDigest), short(vs[0].out))})
				}
			}
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(uses), cmpMS) {
		u := uses[k]
		if len(u.outputs) > 1 {
			var ds, srcs []string
			for _, d := range u.outputs {
				ds = append(ds, short(d))
				srcs = append(srcs, u.outSrc[d])
			}
			c.add(Issue{Kind: KindOutputConflict, Model: k.model, Seq: k.seq, Sources: srcs,
				Detail: fmt.Sprintf("%s appears in replies with %d different outputs: %s", k, len(ds), strings.Join(ds, " vs "))})
		}
		if len(u.reqs) > 1 {
			var srcs []string
			for _, id := range u.reqs {
				srcs = append(srcs, u.reqSrc[id])
			}
			c.add(Issue{Kind: KindSeqShared, Model: k.model, Seq: k.seq, Sources: srcs,
				Detail: fmt.Sprintf("%s appears in replies to %d different requests: req_ids %s", k, len(u.reqs), strings.Join(u.reqs, ", "))})
		}
	}

	// Rule 4: every accepted request has a reply.
	checkAccepted(c, accepted, byReq)
	return r, nil
}

// checkAccepted joins the accepted requests with the replies.
func checkAccepted(c *collector, accepted []Accepted, byReq map[string][]repRec) {
	r := c.r
	named := map[string]bool{}
	// Attempts per client id, first-seen order.
	byClient := map[string][]Accepted{}
	var clients []string
	var bare []Accepted // entries without client id
	for _, a := range accepted {
		if a.ReqID != "" {
			named[a.ReqID] = true
		}
		if a.ClientRequestID == "" {
			bare = append(bare, a)
			continue
		}
		if _, ok := byClient[a.ClientRequestID]; !ok {
			clients = append(clients, a.ClientRequestID)
		}
		byClient[a.ClientRequestID] = append(byClient[a.ClientRequestID], a)
	}
	r.Accepted = len(clients) + len(bare)
	mismatch := func(a Accepted) {
		recs := byReq[a.ReqID]
		if a.ReplyDigest == "" || len(recs) == 0 {
			return
		}
		for _, rp := range recs {
			if rp.ReplyDigest == a.ReplyDigest {
				return
			}
		}
		c.add(Issue{Kind: KindClientMismatch, ReqID: a.ReqID, Sources: []string{recs[0].src},
			Detail: fmt.Sprintf("req_id %s (client id %q): the client received reply %s, the frontend recorded %s",
				a.ReqID, a.ClientRequestID, short(a.ReplyDigest), short(recs[0].ReplyDigest))})
	}
	for _, id := range clients {
		replied := false
		var ids []string
		for _, a := range byClient[id] {
			if a.ReqID == "" {
				continue
			}
			ids = append(ids, a.ReqID)
			if len(byReq[a.ReqID]) > 0 {
				replied = true
			}
			mismatch(a)
		}
		switch {
		case replied:
		case len(ids) == 0:
			c.add(Issue{Kind: KindLost, Detail: fmt.Sprintf("client request %q: accepted, the client received no reply", id)})
		default:
			c.add(Issue{Kind: KindLost, ReqID: ids[0], Detail: fmt.Sprintf(
				"client request %q: accepted, no reply record for req_id %s", id, strings.Join(ids, ", "))})
		}
	}
	for _, a := range bare {
		if len(byReq[a.ReqID]) == 0 {
			c.add(Issue{Kind: KindLost, ReqID: a.ReqID, Detail: fmt.Sprintf("req_id %s: accepted, no reply record", a.ReqID)})
		}
		mismatch(a)
	}
	if len(accepted) > 0 {
		for id := range byReq {
			if !named[id] {
				r.Unmatched++
			}
		}
	}
}

// cmpReqID orders decimal req_ids numerically, others after them lexically.
func cmpReqID(a, b string) int {
	da, db := isDecimal(a), isDecimal(b)
	switch {
	case da && db:
		return cmp.Or(cmp.Compare(len(strings.TrimLeft(a, "0")), len(strings.TrimLeft(b, "0"))),
			cmp.Compare(strings.TrimLeft(a, "0"), strings.TrimLeft(b, "0")), cmp.Compare(a, b))
	case da:
		return -1
	case db:
		return 1
	}
	return cmp.Compare(a, b)
}

func isDecimal(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// diffVariant describes how v differs from v0, naming v's first source.
func diffVariant(v0, v *variant) string {
	var d []string
	if v0.in != v.in {
		d = append(d, fmt.Sprintf("input_digest %s/%s", short(v0.in), short(v.in)))
	}
	if v0.out != v.out {
		d = append(d, fmt.Sprintf("output_digest %s/%s", short(v0.out), short(v.out)))
	}
	if v0.state != v.state {
		d = append(d, fmt.Sprintf("state_digest %s/%s", short(v0.state), short(v.state)))
	}
	return fmt.Sprintf("%s: %s", v.srcs[0], strings.Join(d, ", "))
}

// short abbreviates a digest (or leaves a short string alone) for messages.
func short(s string) string {
	if len(s) > 12 && validDigest("", s) == nil {
		return s[:12]
	}
	return s
}
