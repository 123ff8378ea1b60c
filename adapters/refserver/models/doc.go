// Package models holds the reference model server's real models, written
// in Go over internal/nn: a Fashion-MNIST classifier with trained weights,
// a small CNN, a heavy "transcriber", a per-stream LSTM, an online-learning
// classifier whose weights are its state, and the kNN / ARIMA / A* /
// concat / prep stages of the example services.
//
// Every model implements Model, whose step is split in two, as the NSPB
// protocol needs: Compute reads the installed state, returns outputs and
// stages the next state without installing it; Update(batch_id) installs
// the staged state. ReadState and Compute take the state lock shared,
// Update and WriteState take it exclusively, so a reader never sees a
// half-updated state and a snapshot of state n can be copied while batch
// n+1 computes. Stateless models stage nothing and Update is a no-op.
//
// Matrix products use nn.Parallel by default: partial sums are combined in
// completion order, so replicas drift apart in their low bits (set the
// param deterministic: 1 to use the chunk-order reducer instead).
//
// New(m *config.Model) builds a model from its kind and params; Kinds lists
// the kinds. See docs/models.md for every kind's params.
package models
