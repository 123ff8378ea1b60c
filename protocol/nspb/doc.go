// Package nspb holds the decisions of the NSPB protocol (HAMS paper,
// sections IV-B to IV-D) as pure state machines: events in, actions out, no
// sockets, goroutines or clocks. Drivers in the sidecar and the frontend
// perform the actions in the order returned.
//
//   - Graph facts: previous and next stateful models (PFM / NFM) of every
//     stateful model and of the frontend, from a service graph.
//   - Backup (Algorithm 2): buffers snapshots from the primary and applies
//     them strictly in batch order, each only once every PFM has announced
//     durability up to the seqs its requests' lineage names; after applying,
//     it announces its own durable seq to its NFMs (and the frontend).
//   - ReplyGate: the frontend's rule: a reply leaves only when every
//     stateful state in its lineage is durable (the frontend is the special
//     model whose "apply" is the reply).
//   - Pipeline: the primary's compute/update split: update n+1 waits until
//     the snapshot of state n has been copied, so the copy never sees a
//     half-updated state and the model is never stopped.
package nspb
