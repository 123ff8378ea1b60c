package recovery

import (
	"fmt"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// ActionID names one action; the driver reports its outcome with the same
// id (event MaxSeqAnswered, SummaryAnswered, QueryFailed or ActionDone).
type ActionID uint64

// Kind of an action.
type Kind int

// Action kinds. Queries (GetMaxSeq, GetLineageSummary) are answered with
// MaxSeqAnswered / SummaryAnswered or QueryFailed; Recovered and
// Unrecoverable are notices (no answer expected); every other kind is
// answered ActionDone.
const (
	GetMaxSeq Kind = iota + 1
	GetLineageSummary
	StartInstance
	Promote
	Rollback
	Rewire
	Resend
	Demote
	SyncBackup
	Recovered
	Unrecoverable
	// Retire and Readmit answer AliveAgain (falsely suspected instances,
	// alive.go): decisions the driver applies to its own state at once;
	// no answer is expected.
	Retire
	Readmit
)

var kindNames = map[Kind]string{
	GetMaxSeq: "GetMaxSeq", GetLineageSummary: "GetLineageSummary", StartInstance: "StartInstance",
	Promote: "Promote", Rollback: "Rollback", Rewire: "Rewire", Resend: "Resend", Demote: "Demote",
	SyncBackup: "SyncBackup", Recovered: "Recovered", Unrecoverable: "Unrecoverable",
	Retire: "Retire", Readmit: "Readmit",
}

func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Notice reports whether actions of this kind expect no answer.
func (k Kind) Notice() bool {
	return k == Recovered || k == Unrecoverable || k == Retire || k == Readmit
}

// Change is one placement rewrite of a Rewire: component becomes Role at
// Epoch. All changes of one Rewire are applied atomically.
type Change struct {
	Component string
	Model     string
	Role      hamsv1.Role
	Epoch     uint64
}

// Summary is a LineageSummary answer (see the package doc for its
// semantics).
type Summary struct {
	MaxOut         uint64
	MaxIn          map[string]uint64
	ConsumedBeyond bool
}

// Action is one thing the driver must do. Which fields are set depends on
// Kind:
//   - GetMaxSeq: Component/Address (a backup), Model.
//   - GetLineageSummary: Component/Address (empty Component: a frontend),
//     Model (the model the target serves), FailedModel/FailedMaxSeq.
//   - StartInstance: Model, Role.
//   - Promote: Component/Address, Model, Epoch; StartSeq for a stateless
//     standby (number outputs from StartSeq+1); ReplayAfter for a spare in
//     replay mode (per successor, the highest seq of the model it received:
//     the spare sends it the re-executed outputs above).
//   - Rollback: Component/Address (the primary), Model, Epoch.
//   - Rewire: Changes (one atomic topology update).
//   - Resend: Component/Address of the sender (Model = its model, or
//     config.Frontend), ToModel/ToAddress/Epoch of the receiver, After.
//   - Demote and SyncBackup: Component/Address of the instance that becomes
//     (or is) the backup, Model, Epoch, PrimaryAddress to copy state from.
//   - Recovered: Models recovered in this round (topology rewired).
//   - Unrecoverable: Model, Reason.
//   - Retire: Component, Model, Role (its placement's), Epoch (the
//     model's highest), Reason: a component declared dead that came back
//     and must never serve again (its process is told to exit).
//   - Readmit: Component, Model, Role, Epoch: a component declared dead
//     that came back and is still its model's serving instance (nobody
//     replaced it), or the backup of a model given up whose primary is
//     still dead (it is failed over to next; Reason says so): alive
//     again in its old role.
type Action struct {
	ID        ActionID
	Kind      Kind
	Model     string
	Component string
	Address   string
	Role      hamsv1.Role
	Epoch     uint64
	StartSeq  uint64

	FailedModel  string
	FailedMaxSeq uint64

	ToModel   string
	ToAddress string
	After     uint64

	PrimaryAddress string
	ReplayAfter    map[string]uint64
	Changes        []Change
	Models         []string
	Reason         string
}

func (a Action) String() string {
	switch a.Kind {
	case GetMaxSeq:
		return fmt.Sprintf("#%d GetMaxSeq(%s@%s)", a.ID, a.Component, a.Model)
	case GetLineageSummary:
		return fmt.Sprintf("#%d GetLineageSummary(%s@%s failed=%s>%d)", a.ID, a.Component, a.Model, a.FailedModel, a.FailedMaxSeq)
	case StartInstance:
		return fmt.Sprintf("#%d StartInstance(%s %s)", a.ID, a.Model, a.Role)
	case Promote:
		if a.ReplayAfter != nil {
			return fmt.Sprintf("#%d Promote(%s@%s epoch=%d replay after=%v)", a.ID, a.Component, a.Model, a.Epoch, a.ReplayAfter)
		}
		return fmt.Sprintf("#%d Promote(%s@%s epoch=%d start=%d)", a.ID, a.Component, a.Model, a.Epoch, a.StartSeq)
	case Rollback:
		return fmt.Sprintf("#%d Rollback(%s@%s epoch=%d)", a.ID, a.Component, a.Model, a.Epoch)
	case Rewire:
		return fmt.Sprintf("#%d Rewire(%v)", a.ID, a.Changes)
	case Resend:
		return fmt.Sprintf("#%d Resend(%s -> %s after %d epoch=%d)", a.ID, a.Model, a.ToModel, a.After, a.Epoch)
	case Demote, SyncBackup:
		return fmt.Sprintf("#%d %s(%s@%s epoch=%d primary=%s)", a.ID, a.Kind, a.Component, a.Model, a.Epoch, a.PrimaryAddress)
	case Recovered:
		return fmt.Sprintf("Recovered(%v)", a.Models)
	case Unrecoverable:
		return fmt.Sprintf("Unrecoverable(%s: %s)", a.Model, a.Reason)
	case Retire:
		return fmt.Sprintf("Retire(%s@%s %s epoch=%d: %s)", a.Component, a.Model, a.Role, a.Epoch, a.Reason)
	case Readmit:
		return fmt.Sprintf("Readmit(%s@%s %s epoch=%d)", a.Component, a.Model, a.Role, a.Epoch)
	}
	return fmt.Sprintf("#%d %s", a.ID, a.Kind)
}
