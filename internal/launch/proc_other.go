//go:build !linux

package launch

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func killGroup(pid int, sig syscall.Signal) error { return syscall.Kill(-pid, sig) }
