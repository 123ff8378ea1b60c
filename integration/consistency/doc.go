// Package consistency is the independent global-consistency checker of
// HAMS-Go. It reads the audit logs of a run (every durable.jsonl and
// replies.jsonl under an audit directory, see internal/audit and the
// --audit contract in docs/design.md) and the list of requests the load
// generator got accepted, and decides whether what clients saw is
// consistent with one linear history per stateful model (HAMS paper,
// section IV-F). It trusts nothing but the records: it shares no code with
// the sidecar or the frontend beyond the record types.
//
// The rules, each a kind of Issue:
//
//   - forked-history (conflict): for each (model, seq) every durable record
//     agrees on input_digest, output_digest and state_digest. Records may
//     repeat (a backup and, after a failover, its successor may both write
//     one); they must then be identical.
//   - reply-not-in-history (conflict): a reply's lineage step at a stateful
//     model (one with durable records, or named in Options.Stateful) has an
//     output_digest that no durable record of that (model, seq) has: the
//     client saw an output the durable history does not contain, which is
//     what checkpoint-replay produces under non-determinism (paper II-C).
//   - not-durable: a reply's stateful lineage step has no durable record at
//     all. A conflict when the run is quiescent (Options.Quiescent), since
//     NSPB releases a reply only after every state it depends on is durable;
//     otherwise only counted.
//   - duplicate-conflict (conflict): one req_id answered with two different
//     reply digests.
//   - output-conflict (conflict): one stateful (model, seq) appears in
//     replies with two different output digests.
//   - seq-shared (conflict): one stateful (model, seq) appears in replies to
//     two different requests (a model executes one request per seq).
//   - client-mismatch (conflict): the load generator saw a reply digest
//     (Accepted.ReplyDigest) that differs from the frontend's record.
//   - duplicate: one req_id answered more than once with the same digest
//     (counted, not a conflict).
//   - lost: an accepted request without a reply record.
//
// Counting: Report.Conflicts is the number of conflict issues (each
// forked (model, seq), each mismatching (req_id, model, seq), each
// req_id with divergent replies, ...); Report.Duplicates the number of
// reply records beyond the first per (req_id, reply digest);
// Report.Lost the number of accepted requests (client ids, or req_ids
// where no client id is known) without a reply. Only the first
// Options.MaxExamples issues of each kind are kept as examples.
//
// Main loop: Check reads every record (a line that does not decode, or a
// record missing a required field, is an error naming file and line; a
// crash-torn final line without newline is tolerated and listed), indexes
// durable records by (model, seq), then walks replies grouped by req_id,
// and finally joins the accepted list with the replies.
package consistency
