// Package netfault injects network faults into processes of one host
// for chaos testing: a process-level partition (every packet the process
// sends is dropped, so it can neither reach nor answer anyone) through a
// net_cls cgroup and an iptables cgroup match. Root only; the kernel
// needs the net_cls controller and the xt_cgroup match.
package netfault

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrUnsupported: this host cannot isolate processes (not root, no
// cgroup v2, no iptables).
var ErrUnsupported = errors.New("netfault: process isolation unsupported here")

// netClsRoot finds the net_cls (cgroup v1) hierarchy, mounting it under
// /run/hams-netcls when the host has it unmounted. net_cls, not cgroup
// v2: a v2 cgroup match sees the cgroup a socket was created in, so a
// process moved later keeps its old sockets unmatched, while moving a
// task into a net_cls cgroup retags the sockets it holds.
func netClsRoot() (string, error) {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 4 && fields[2] == "cgroup" && slices.Contains(strings.Split(fields[3], ","), "net_cls") {
			f.Close()
			return fields[1], nil
		}
	}
	f.Close()
	dir := "/run/hams-netcls"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	if out, err := exec.Command("mount", "-t", "cgroup", "-o", "net_cls", "net_cls", dir).CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w: mount net_cls: %v: %s", ErrUnsupported, err, bytes.TrimSpace(out))
	}
	return dir, nil
}

// Supported reports whether Isolate can work here, and why not.
func Supported() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root", ErrUnsupported)
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		return fmt.Errorf("%w: no iptables", ErrUnsupported)
	}
	_, err := netClsRoot()
	return err
}

func iptables(args ...string) error {
	out, err := exec.Command("iptables", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("netfault: iptables %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// Isolation is one isolated process.
type Isolation struct {
	pid     int
	ports   []int
	root    string
	dir     string
	classid string
	healed  bool
}

// rule adds (-I) or deletes (-D) the drop rules: what the process sends
// (its net_cls class), and what arrives for its listening ports (the
// packets of connections peers opened to it are sent from sockets that
// may predate the move, so the sending side alone does not cut them).
func (i *Isolation) rule(op string) error {
	var errs []error
	if err := iptables(op, "OUTPUT", "-m", "cgroup", "--cgroup", i.classid, "-j", "DROP"); err != nil {
		errs = append(errs, err)
	}
	for _, p := range i.ports {
		if err := iptables(op, "INPUT", "-p", "tcp", "--dport", strconv.Itoa(p), "-j", "DROP"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Isolate drops every packet pid sends, and every packet for its
// listening ports, from now until Heal: its connections stall both ways,
// as if its host were cut off the network.
func Isolate(pid int, ports ...int) (*Isolation, error) {
	if err := Supported(); err != nil {
		return nil, err
	}
	root, err := netClsRoot()
	if err != nil {
		return nil, err
	}
	iso := &Isolation{pid: pid, ports: ports, root: root, dir: filepath.Join(root, "hams-isolate-"+strconv.Itoa(pid)),
		classid: fmt.Sprintf("0x%08x", 0x00a70000|(pid&0xffff))}
	if err := os.Mkdir(iso.dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("netfault: cgroup %s: %w", iso.dir, err)
	}
	if err := os.WriteFile(filepath.Join(iso.dir, "net_cls.classid"), []byte(iso.classid), 0o644); err != nil {
		_ = os.Remove(iso.dir)
		return nil, fmt.Errorf("netfault: classid of %s: %w", iso.dir, err)
	}
	// The rule first, then the move: no packet of the moved process
	// escapes between the two.
	if err := iso.rule("-I"); err != nil {
		_ = os.Remove(iso.dir)
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(iso.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		_ = iso.rule("-D")
		_ = os.Remove(iso.dir)
		return nil, fmt.Errorf("netfault: move pid %d into %s: %w", pid, iso.dir, err)
	}
	return iso, nil
}

// Heal lets the process's packets out again and moves it back. It is
// idempotent; a process that exited meanwhile is fine.
func (i *Isolation) Heal() error {
	if i.healed {
		return nil
	}
	i.healed = true
	var errs []error
	// Move back first (its sockets lose the classid), then drop the rule.
	if err := os.WriteFile(filepath.Join(i.root, "cgroup.procs"), []byte(strconv.Itoa(i.pid)), 0o644); err != nil &&
		!strings.Contains(err.Error(), "no such process") {
		errs = append(errs, fmt.Errorf("netfault: move pid %d back: %w", i.pid, err))
	}
	if err := i.rule("-D"); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(i.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("netfault: remove cgroup: %w", err))
	}
	return errors.Join(errs...)
}
