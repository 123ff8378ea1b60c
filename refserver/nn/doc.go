// Package nn is the small float32 linear algebra behind the reference
// models (refserver/models): matrix products, activations and
// seeded initialisation, with plain loops and no cgo.
//
// Non-determinism is real, not simulated: a Reducer splits the reduction
// (K) dimension of a big enough matrix product into chunks, reduces each
// chunk on its own goroutine into a private partial, and adds the partials
// into the result in the order they arrive on a channel, as GPU atomics
// do. Float addition is not associative, so two replicas given identical
// inputs can differ in their low bits, and a stateful model's state drifts
// apart over many batches. Reducer{Deterministic: true} sums the chunks in
// index order instead (bit-exact across runs), for tests that compare
// exactly and for training.
package nn
