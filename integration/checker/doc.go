// Package checker verifies replies of a HAMS-Go service against the
// guarantees the system makes, so demos, benchmarks and integration tests
// judge every reply the same way:
//
//   - a reply carries no error and one output per sink model of the
//     service, each with the tensor names, datatypes and trailing
//     dimensions the sink's Describe declares, and as many rows as the
//     request had;
//   - its lineage names every model of the service graph, and every pred
//     link resolves inside the reply (an entry <P, S, M, s> with P not the
//     frontend has an entry for model P with seq S);
//   - across all replies, no (model, seq) pair appears in two different
//     replies (a model never executes two requests under one seq, and no
//     request is answered with another's outputs);
//   - every request got exactly one reply (Finish reports the missing ones).
//
// The Checker is safe for concurrent use: load generators call it from
// every client goroutine.
package checker
