// Package models holds the reference model server's real models, written
// in Go over internal/nn: a Fashion-MNIST classifier with trained weights,
// a small CNN, a heavy "transcriber", a per-stream LSTM, an online-learning
// classifier whose weights are its state, and the kNN / ARIMA / A* /
// concat / prep stages of the example services.
//
// ParM (parity models) support: kind classifier with param weights:
// fashion-parity-sum-k{2,3,4} serves the classifier's parity model for the
// sum encoder (same 784-128-10 MLP, no output softmax, trained by
// cmd/train-parity; FashionParityMLP(k) returns it, EvalParity scores
// one), and kind linear (scores = images·W, a seeded matrix, no bias) is
// its own exact parity model, for exactness tests of the serving path.
// The weights files mark a parity model by its magic (EncodeMLP), and
// EmbeddedMLP refuses a file of the wrong kind or shape.
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
