package integration

// A network lab: hosts as network namespaces joined by veth pairs to one
// bridge in the root namespace (which the test process, the client,
// lives in), and faults as iptables rules inside a host's namespace:
// partitions (DROP to and from a peer) and random loss (the statistic
// match). Root only; tests skip with a message elsewhere. (tc netem
// would add delay, but this kernel has no sch_netem: delay is not
// injected.)

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
)

var labSeq atomic.Uint32

type netLab struct {
	t      *testing.T
	id     string
	bridge string
	hosts  map[string]*labHost
	next   int
}

type labHost struct {
	name, ns, ip, veth string
}

func run(t *testing.T, args ...string) error {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func mustRun(t *testing.T, args ...string) {
	t.Helper()
	if err := run(t, args...); err != nil {
		t.Fatal(err)
	}
}

// newNetLab creates the bridge (10.77.<n>.1/24) or skips the test when
// this process may not create namespaces.
func newNetLab(t *testing.T) *netLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network lab: needs root (ip netns, veth, iptables)")
	}
	for _, tool := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("network lab: %s not installed (iproute2, iptables)", tool)
		}
	}
	n := labSeq.Add(1) + uint32(os.Getpid()%200)
	l := &netLab{t: t, id: fmt.Sprintf("%d", n%250), hosts: map[string]*labHost{}, next: 10}
	l.bridge = "hbr" + l.id
	probe := "hamsprobe" + l.id
	if err := run(t, "ip", "netns", "add", probe); err != nil {
		t.Skipf("network lab: cannot create a network namespace: %v", err)
	}
	_ = run(t, "ip", "netns", "del", probe)
	if err := run(t, "ip", "link", "add", l.bridge, "type", "bridge"); err != nil {
		t.Skipf("network lab: cannot create a bridge: %v", err)
	}
	t.Cleanup(l.close)
	mustRun(t, "ip", "addr", "add", l.subnet(1)+"/24", "dev", l.bridge)
	mustRun(t, "ip", "link", "set", l.bridge, "up")
	// Bridged traffic must not be filtered by the root namespace's rules.
	_ = os.WriteFile("/proc/sys/net/bridge/bridge-nf-call-iptables", []byte("0"), 0o644)
	return l
}

func (l *netLab) subnet(host int) string { return fmt.Sprintf("10.77.%s.%d", l.id, host) }

// clientIP is the root namespace's address on the bridge.
func (l *netLab) clientIP() string { return l.subnet(1) }

// host adds a namespace with one veth on the bridge.
func (l *netLab) host(name string) *labHost {
	t := l.t
	t.Helper()
	n := l.next
	l.next++
	h := &labHost{name: name, ns: fmt.Sprintf("hams%s-%s", l.id, name), ip: l.subnet(n), veth: fmt.Sprintf("hv%s-%d", l.id, n)}
	mustRun(t, "ip", "netns", "add", h.ns)
	mustRun(t, "ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.ns)
	mustRun(t, "ip", "link", "set", h.veth, "master", l.bridge)
	mustRun(t, "ip", "link", "set", h.veth, "up")
	mustRun(t, "ip", "netns", "exec", h.ns, "ip", "addr", "add", h.ip+"/24", "dev", "eth0")
	mustRun(t, "ip", "netns", "exec", h.ns, "ip", "link", "set", "eth0", "up")
	mustRun(t, "ip", "netns", "exec", h.ns, "ip", "link", "set", "lo", "up")
	l.hosts[name] = h
	return h
}

// cmd is hams args run inside h's namespace.
func (h *labHost) cmd(args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.ns, hamsBin}, args...)...)
}

func (h *labHost) iptables(t *testing.T, args ...string) {
	t.Helper()
	mustRun(t, append([]string{"ip", "netns", "exec", h.ns, "iptables"}, args...)...)
}

// cut drops everything between h and peer (both directions, both
// hosts' rules: a full partition of the pair).
func (l *netLab) cut(a, b *labHost) {
	for _, p := range [][2]*labHost{{a, b}, {b, a}} {
		p[0].iptables(l.t, "-A", "INPUT", "-s", p[1].ip, "-j", "DROP")
		p[0].iptables(l.t, "-A", "OUTPUT", "-d", p[1].ip, "-j", "DROP")
	}
}

// lose drops a fraction of the packets h sends to peer (one direction:
// asymmetric loss).
func (l *netLab) lose(h, peer *labHost, fraction float64) {
	h.iptables(l.t, "-A", "OUTPUT", "-d", peer.ip, "-m", "statistic", "--mode", "random", "--probability", fmt.Sprintf("%.2f", fraction), "-j", "DROP")
}

// heal removes every fault rule of every host.
func (l *netLab) heal() {
	for _, h := range l.hosts {
		h.iptables(l.t, "-F", "INPUT")
		h.iptables(l.t, "-F", "OUTPUT")
	}
}

func (l *netLab) close() {
	for _, h := range l.hosts {
		// Processes in the namespace are the tests' (startProc kills
		// them at cleanup, which runs before this one: LIFO).
		_ = exec.Command("ip", "netns", "del", h.ns).Run()
	}
	_ = exec.Command("ip", "link", "del", l.bridge).Run()
}
