package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// replicaChild reports whether a deployment child belongs on the replica
// CPUs.
func replicaChild(name string) bool {
	return name == "nats" || strings.HasPrefix(name, "manager") || strings.Contains(name, "backup") || strings.Contains(name, "standby")
}

// CPUHalves splits the CPUs this process may use into the serving half
// and the replica half.
func CPUHalves() (serving, replicas []int, err error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, nil, fmt.Errorf("read CPU affinity: %w", err)
	}
	var cpus []int
	for i := 0; i < 1024; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if len(cpus) < 2 {
		return nil, nil, fmt.Errorf("isolating replicas needs 2 CPUs, this process may use %d", len(cpus))
	}
	return cpus[:len(cpus)/2], cpus[len(cpus)/2:], nil
}

// PinPID sets the affinity of every thread of pid (threads started later
// inherit it from the thread that starts them).
func PinPID(pid int, cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil || len(tasks) == 0 {
		return fmt.Errorf("list threads of %d: %v", pid, err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(filepath.Base(t))
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !os.IsNotExist(err) && err != unix.ESRCH {
			return fmt.Errorf("pin thread %d of %d: %w", tid, pid, err)
		}
	}
	return nil
}

// IsolateReplicas pins the children of d to their halves.
func IsolateReplicas(d *Deployment, serving, replicas []int) error {
	if runtime.GOOS != "linux" {
		return fmt.Errorf("isolating replicas needs Linux CPU affinity")
	}
	for _, name := range d.Supervisor.Names() {
		pid, ok := d.Supervisor.Pid(name)
		if !ok {
			continue
		}
		cpus := serving
		if replicaChild(name) {
			cpus = replicas
		}
		if err := PinPID(pid, cpus); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}
