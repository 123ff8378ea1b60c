package launch

import "syscall"

// sysProcAttr puts the child in its own process group (so a signal reaches
// everything it started) and kills it when the parent thread dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func killGroup(pid int, sig syscall.Signal) error { return syscall.Kill(-pid, sig) }
