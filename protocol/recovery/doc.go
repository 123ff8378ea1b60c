// Package recovery is the manager's failover logic (HAMS paper IV-C, IV-E)
// as a pure state machine in the vocabulary of package protocol: no
// goroutines, sockets or clocks. The driver (package manager) feeds it
// events through Step (its only entry point: events in, actions out) and
// performs the Actions it returns, in order; tests drive it from a
// simulated service graph, and the transcripts under protocol/testdata
// (failover.txt, correlated.txt) replay the paper's failovers.
//
// # Events and actions
//
//	TopologyChanged  the deployment state changed (new instances show up)
//	Suspected        a component is suspected: starts or extends a round
//	AliveAgain       a component declared dead was heard from -> Readmit or Retire
//	SpareJoined      a live spare joined: a model without a backup gets it
//	MaxSeqAnswered   answers GetMaxSeq (same ActionID)
//	SummaryAnswered  answers GetLineageSummary
//	QueryFailed      a query got no answer (retried, then its target is dead)
//	ActionDone       outcome of StartInstance, Promote, Rollback, Rewire,
//	                 Resend, Demote, SyncBackup
//
// Recovered, Unrecoverable, Retire and Readmit are notices (Kind.Notice):
// no event answers them. Every Action is a recovery.Action whose Kind
// says which fields are set.
//
// # Rounds
//
// A suspicion starts a round. While the round queries (stage "query"),
// further suspicions, and targets of queries that fail QueryAttempts times,
// are merged into it (failures identified iteratively, paper VI-D); once it
// commits they wait for the next round. Per model the round holds one task:
//   - stateless model whose ACTIVE died: pick a live STANDBY (or
//     StartInstance(model, STANDBY) and wait for it in the topology); ask
//     every successor for GetLineageSummary(failed_model=model); a dead
//     successor is replaced by its backup (stateful) or its own successors
//     (stateless), a frontend that does not answer counts as "seen nothing".
//     The standby is promoted with StartSeq = the highest max_out seen
//     (seqs are never reused) and resend positions = the lowest positions
//     seen (nothing is skipped; receivers drop duplicates).
//   - stateful model whose PRIMARY died (failover): GetMaxSeq and
//     GetLineageSummary (its resend positions) from the live backup; then
//     GetLineageSummary(failed_model, failed_max_seq=max_seq) from the
//     primary of every stateful model downstream. One that consumed beyond
//     is failed over too (its backup promoted, the old primary demoted) or,
//     when its backup is dead, rolled back (Rollback, then its positions are
//     asked from the rolled-back primary).
//   - a dead BACKUP or STANDBY is replaced after the round
//     (StartInstance, then SyncBackup once the new backup shows up).
//
// Commit: Promote/Rollback every task at epoch = the model's highest
// epoch + 1; then one Rewire (an atomic topology update: new primaries and
// actives at the new epoch, old primaries become backups at the new epoch,
// old actives become standbys); then the Recovered notice, the Resends
// (per recovered model X, from every stateful or frontend model S that
// reaches X through stateless models only, on the edge S -> first hop,
// after X's position for S, merged per edge with the minimum), Demote of
// an old primary that is still alive, and StartInstance for lost backups
// and used standbys. A model with primary and backup both dead is reported
// Unrecoverable.
//
// # Replay mode
//
// With Config.Replay (deployment mode replay, the Lineage-Stash-style
// baseline) a stateful model's BACKUP placement is a spare without state:
// its state lives in the checkpoint and input log in JetStream. A dead
// PRIMARY starts a replay task instead of a failover: pick a live spare
// (or StartInstance(model, BACKUP) and wait for it in the topology); ask
// every successor (frontends for the sink edge) GetLineageSummary(
// failed_model=model) for max_out, the highest seq of the model it
// received (0 when it cannot be asked); commit: Promote(spare, epoch,
// ReplayAfter = those max_outs), on which the spare loads the newest
// checkpoint, re-executes the log and sends each successor the outputs
// beyond its max_out; then the new primary's own GetLineageSummary gives
// the resend positions (if it does not answer, positions 0: everything
// kept is resent and dropped by request key). Rewire, resends, Demote of a
// live old primary (it becomes a spare) or StartInstance(BACKUP) for a new
// spare follow as for a failover, but downstream stateful models are never
// asked about consumption nor failed over or rolled back, no GetMaxSeq is
// sent and no new spare is synced. A spare that fails to replay is
// replaced in the next round; after ReplayAttempts failures in a row the
// model is Unrecoverable. A model whose primary and spare both died is
// recovered on a spare started for it.
//
// # LineageSummary semantics expected from sidecars
//
// With failed_model F set: max_out_seq is the highest seq of F in the
// lineage of requests the responder received; max_in_by_pred[U], for every
// model U upstream of F in that lineage (including "frontend"), the highest
// U seq such that every request of U up to it that reached F is covered;
// consumed_beyond: a request the responder executed names F with a seq
// above failed_max_seq. Without failed_model: the same about the
// responder itself (for a backup: the requests its applied snapshots
// cover).
package recovery
