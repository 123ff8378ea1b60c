package cluster

import (
	"net"
)

// dashboardArgs are manager i's --dashboard arguments for a deployment
// whose first manager serves it on addr (empty: none): the others on a
// free port of the same host, each showing what it sees.
func dashboardArgs(addr string, i int) []string {
	if addr == "" {
		return nil
	}
	if i > 0 {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = "127.0.0.1"
		}
		addr = net.JoinHostPort(host, "0")
	}
	return []string{"--dashboard", addr}
}

// DashboardURL is the URL of the i-th dashboard address ("" if none).
func DashboardURL(addrs []string, i int) string {
	if i >= len(addrs) {
		return ""
	}
	return "http://" + addrs[i] + "/"
}

// DashboardURLs are the URLs of every dashboard address.
func DashboardURLs(addrs []string) []string {
	var out []string
	for i := range addrs {
		out = append(out, DashboardURL(addrs, i))
	}
	return out
}
