// Package paritytrain trains ParM parity models (SOSP'19, sections 4.4
// and 7) and the deployed classifiers they protect, in Go, on the CPU.
//
// A parity model for a (k, r) code is trained per parity index j: its
// input is parity query j of a coding group of k queries, built by the
// serving path's own encoder (protocol/parity.NewSumEncoder or
// NewConcatEncoder), and its target is Σ_i parity.Coefficient(j,i)·F(X_i),
// F the deployed model's outputs (MSE, the paper's loss), or for the
// concat encoder the group's one-hot labels summed and normalised
// (cross-entropy). Reconstructions are scored with the serving decoder
// (parity.Decoder): degraded accuracy Ad against the true labels and
// agreement with the deployed model's top-1.
//
// The pieces compose for any source of samples: a Sample is a query, the
// deployed model's output for it and an optional true label; a Set holds
// samples (a dataset labelled by a deployed model, Label runs a black-box
// Deployed in batches and refuses a change of output shape), a Buffer
// keeps a bounded uniform sample of a stream (live traffic). A Trainer
// takes minibatch Adam steps (weight decay as L2, as PyTorch's Adam),
// data-parallel over fixed shards of the minibatch whose gradients are
// summed in shard order, so a seed gives bit-identical weights on any
// number of cores; Fit runs epochs with coding groups redrawn every epoch,
// validates after each and keeps the best; WriteWeights exports the
// network in the reference model server's format (nn.EncodeNet) with its
// Provenance, writing a temporary file and renaming it.
package paritytrain
