package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Replica isolation for benchmarks (bench --isolate-replicas). The HAMS
// paper runs every model, backup and coordination service on hosts of
// its own, so replication never takes CPU from the serving path. On one
// machine the closest stand-in is CPU affinity: the serving path (the
// frontend, and each model's serving sidecar and model server) on one
// half of the CPUs, everything that a real deployment puts on other hosts
// (backups, hot standbys, the manager with its JetStream, and the load
// generator, which plays the clients) on the other half. Every mode of a
// run gets the same split, so bare and nspb serve on the same CPUs.

// replicaChild reports whether a deployment child belongs on the replica
// CPUs.
func replicaChild(name string) bool {
	return name == "nats" || strings.HasPrefix(name, "manager") || strings.Contains(name, "backup") || strings.Contains(name, "standby")
}

// cpuHalves splits the CPUs this process may use into the serving half
// and the replica half.
func cpuHalves() (serving, replicas []int, err error) {
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

// pinPid sets the affinity of every thread of pid (threads started later
// inherit it from the thread that starts them).
func pinPid(pid int, cpus []int) error {
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

// isolateReplicas pins the children of d to their halves.
func isolateReplicas(d *deployment, serving, replicas []int) error {
	if runtime.GOOS != "linux" {
		return fmt.Errorf("isolating replicas needs Linux CPU affinity")
	}
	for _, name := range d.sup.Names() {
		pid, ok := d.sup.Pid(name)
		if !ok {
			continue
		}
		cpus := serving
		if replicaChild(name) {
			cpus = replicas
		}
		if err := pinPid(pid, cpus); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}
