package config

// Mode is a fault-tolerance mode (Deployment.Mode, --mode). A parsed
// deployment always has one (the default is nspb); the empty mode of a
// deployment built by hand counts as unprotected.
type Mode string

// The modes (Modes lists them as strings).
const (
	ModeBare   Mode = "bare"
	ModeNSPB   Mode = "nspb"
	ModeRemus  Mode = "remus"
	ModeNSPBS1 Mode = "nspb-s1"
	ModeNSPBS2 Mode = "nspb-s2"
	ModeReplay Mode = "replay"
)

// Protected reports whether the mode survives a failure: every mode but
// bare (and the empty one).
func (m Mode) Protected() bool { return m != "" && m != ModeBare }

// Replays reports whether stateful models are recovered by replaying
// their input log (replay), not from a replicated backup.
func (m Mode) Replays() bool { return m == ModeReplay }

// Replicates reports whether replicated stateful models ship their state
// to a backup: the protected modes but replay.
func (m Mode) Replicates() bool { return m.Protected() && !m.Replays() }

// RunMode is the deployment's mode as a Mode.
func (d *Deployment) RunMode() Mode { return Mode(d.Mode) }
