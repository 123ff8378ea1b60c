// Package models holds the reference model server's real models, written
// in Go over refserver/nn: a Fashion-MNIST classifier with trained weights,
// a small CNN, a heavy "transcriber", a per-stream LSTM, an online-learning
// classifier whose weights are its state, and the kNN / ARIMA / A* /
// concat / prep stages of the example services.
//
// ParM (parity models) support: the embedded weights (weights/) hold
// networks in the versioned format of nn.EncodeNet (DecodeWeights also
// reads the original HAMSMLP1/HAMSMLPL MLP files): the deployed
// classifier fashion-mlp (784-128-10, softmax), the paper's deployed MLP
// fashion-paper-mlp (784-200-100-10, logits) and fashion-lenet (LeNet-5,
// logits), and parity models of each, named by ParityWeightsName
// (fashion-parity-sum-k{2,3,4}, fashion-parity-concat-k{2,3,4},
// fashion-parity-sum-k2-p1, fashion-paper-mlp-parity-sum-k2, ...). Kind
// classifier serves any embedded 784 -> 10 network (default fashion-mlp),
// kind mlp any embedded network (default fashion-paper-mlp); a parity
// model's weights must have linear outputs (EmbeddedNet refuses a softmax
// one). Every file but fashion-mlp records how it was trained and its
// test accuracy (internal/paritytrain.Provenance), which
// TestCommittedWeights checks; `hams parity train` and `hams parity eval`
// (docs/parity.md) produce and score them. Kind linear (scores = images·W,
// a seeded matrix, no bias) is its own exact parity model, for exactness
// tests of the serving path.
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
