package cluster

import (
	"strings"
	"time"
)

func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func MsSince(from, to time.Time) float64 {
	return Round3(float64(to.Sub(from)) / float64(time.Millisecond))
}

func Round3(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }
