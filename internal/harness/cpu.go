package harness

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/hams-go/hams/internal/cluster"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux ABI (sysconf(_SC_CLK_TCK)); the kernel's own HZ does
// not show through /proc.
const clockTicks = 100

// clientProc is the name the bench process itself (the load generator)
// has in a CPU sample, beside the deployment's children.
const clientProc = "client"

// parseProcStat returns utime+stime, in seconds, from the contents of
// /proc/<pid>/stat. The command name (field 2) is in parentheses and may
// itself contain spaces and parentheses, so the fields are counted after
// the last ')': field 3 (state) comes first, utime is field 14 and stime
// field 15 (proc(5)).
func parseProcStat(b []byte) (float64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc stat: no ')' closing the command name")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("parse /proc stat: %d fields after the command name, want at least 13", len(f))
	}
	ut, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse /proc stat utime %q: %w", f[11], err)
	}
	st, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse /proc stat stime %q: %w", f[12], err)
	}
	return float64(ut+st) / clockTicks, nil
}

// procCPUSeconds is the CPU time (user + system) process pid has used.
func procCPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("read CPU time of pid %d: %w", pid, err)
	}
	return parseProcStat(b)
}

// cpuSample is the CPU seconds each process of a deployment has used so
// far, by child name (clientProc: this process).
type cpuSample map[string]float64

// sampleCPU reads the CPU time of every running child of d and of this
// process. A child that cannot be read (it just exited) is left out.
func sampleCPU(d *cluster.Deployment) cpuSample {
	s := cpuSample{}
	for _, name := range d.Supervisor.Names() {
		pid, ok := d.Supervisor.Pid(name)
		if !ok {
			continue
		}
		if v, err := procCPUSeconds(pid); err == nil {
			s[name] = v
		}
	}
	if v, err := procCPUSeconds(os.Getpid()); err == nil {
		s[clientProc] = v
	}
	return s
}

// cpuAcc is the CPU seconds each process used during the measured runs
// of one mode, by child name.
type cpuAcc map[string]float64

// add accumulates what each process used between before and after. A
// process missing from either sample, or whose time went down (restarted
// in between: a new pid), adds nothing: its time cannot be attributed.
func (a cpuAcc) add(before, after cpuSample) {
	for name, v := range after {
		if b, ok := before[name]; ok && v >= b {
			a[name] += v - b
		}
	}
}

// roleOf is the role of a child name: "backup-sidecar:m.2" is a
// backup-sidecar, "nats" is nats.
func roleOf(child string) string {
	r, _, _ := strings.Cut(child, ":")
	return r
}

// ofChild is the CPU seconds of the child that plays role for model (the
// first instance, cluster.ChildName).
func (a cpuAcc) ofChild(role cluster.ChildRole, model string) float64 {
	return a[cluster.ChildName(role, model)]
}

// msPerRequest is the CPU time per request in ms, summed by role, plus
// "total" over every process; nil without requests.
func (a cpuAcc) msPerRequest(requests int) map[string]float64 {
	if requests <= 0 || len(a) == 0 {
		return nil
	}
	out := map[string]float64{}
	total := 0.0
	for name, sec := range a {
		out[roleOf(name)] += sec
		total += sec
	}
	out["total"] = total
	for r, sec := range out {
		out[r] = cluster.Round3(sec * 1000 / float64(requests))
	}
	return out
}

// cpuMsPerMB is the CPU time in ms spent per MB (1e6 bytes) of bytes; 0
// when nothing was replicated.
func cpuMsPerMB(cpuSeconds, bytes float64) float64 {
	if bytes <= 0 {
		return 0
	}
	return cpuSeconds * 1000 / (bytes / 1e6)
}

// memcpyMsPerMB is the time in ms one memcpy of a MB takes at a
// bandwidth of mbs MB/s; 0 if unknown.
func memcpyMsPerMB(mbs float64) float64 {
	if mbs <= 0 {
		return 0
	}
	return 1000 / mbs
}

// cpuRoleOrder is the column order of the CPU table: the data path first,
// then the replicas, the control plane and the load generator.
var cpuRoleOrder = []string{string(cluster.RoleSidecar), string(cluster.RoleModelServer), string(cluster.RoleFrontend), string(cluster.RoleBackupSidecar),
	string(cluster.RoleBackupModelServer), string(cluster.RoleStandbySidecar), string(cluster.RoleStandbyModelSrv), string(cluster.RoleManager), string(cluster.RoleNATS), clientProc, "total"}

// cpuRoles lists the roles of rows' CPU figures: cpuRoleOrder first,
// then any other role, sorted.
func cpuRoles(rows []BenchRow) []string {
	var extra []string
	seen := map[string]bool{}
	for _, r := range rows {
		for role := range r.CPUMsPerRequest {
			seen[role] = true
			if !slices.Contains(cpuRoleOrder, role) && !slices.Contains(extra, role) {
				extra = append(extra, role)
			}
		}
	}
	slices.Sort(extra)
	var out []string
	for _, role := range cpuRoleOrder {
		if seen[role] {
			out = append(out, role)
		}
	}
	return append(out, extra...)
}
