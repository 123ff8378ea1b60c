package dashboard

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// A scrape of one component's /metrics, reduced to the hams_* series:
// counters and gauges by series key (name plus its labels but model, e.g.
// `hams_pool_batches_total{outcome="reconstructed"}`), histograms by the
// same key of their name.
type sample struct {
	at     time.Time
	values map[string]float64
	hists  map[string]hist
}

type hist struct {
	count   float64
	buckets []bucket // cumulative, by upper bound
}

type bucket struct {
	le, cum float64
}

// maxScrapeBytes bounds one /metrics body.
const maxScrapeBytes = 8 << 20

// parseMetrics reduces a Prometheus text exposition to a sample.
func parseMetrics(r io.Reader, at time.Time) (sample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return sample{}, fmt.Errorf("parse metrics: %w", err)
	}
	s := sample{at: at, values: map[string]float64{}, hists: map[string]hist{}}
	for name, f := range fams {
		if !strings.HasPrefix(name, "hams_") {
			continue
		}
		for _, m := range f.GetMetric() {
			key := seriesKey(name, m.GetLabel())
			switch {
			case m.Counter != nil:
				s.values[key] += m.GetCounter().GetValue()
			case m.Gauge != nil:
				s.values[key] += m.GetGauge().GetValue()
			case m.Untyped != nil:
				s.values[key] += m.GetUntyped().GetValue()
			case m.Histogram != nil:
				h := hist{count: float64(m.GetHistogram().GetSampleCount())}
				for _, b := range m.GetHistogram().GetBucket() {
					h.buckets = append(h.buckets, bucket{le: b.GetUpperBound(), cum: float64(b.GetCumulativeCount())})
				}
				s.hists[key] = addHist(s.hists[key], h)
			}
		}
	}
	return s, nil
}

// seriesKey is name{l1="v1",...} with the labels sorted, model left out
// (every sidecar series carries its one model).
func seriesKey(name string, labels []*dto.LabelPair) string {
	var parts []string
	for _, l := range labels {
		if l.GetName() == "model" {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	if len(parts) == 0 {
		return name
	}
	sort.Strings(parts)
	return name + "{" + strings.Join(parts, ",") + "}"
}

// addHist adds b to a (same bucket bounds, or a empty).
func addHist(a, b hist) hist {
	if len(a.buckets) == 0 {
		return hist{count: b.count, buckets: append([]bucket(nil), b.buckets...)}
	}
	if len(a.buckets) != len(b.buckets) {
		return a
	}
	a.count += b.count
	for i := range a.buckets {
		a.buckets[i].cum += b.buckets[i].cum
	}
	return a
}

// subHist is a - b (b an earlier scrape of the same series); a counter
// reset (a smaller count) yields a itself.
func subHist(a, b hist) hist {
	if len(a.buckets) != len(b.buckets) || b.count > a.count {
		return a
	}
	out := hist{count: a.count - b.count, buckets: make([]bucket, len(a.buckets))}
	for i := range a.buckets {
		out.buckets[i] = bucket{le: a.buckets[i].le, cum: a.buckets[i].cum - b.buckets[i].cum}
	}
	return out
}

// quantile estimates the q-quantile of h as Prometheus'
// histogram_quantile does (linear within a bucket); NaN without samples.
func quantile(q float64, h hist) float64 {
	if h.count <= 0 || len(h.buckets) == 0 {
		return math.NaN()
	}
	rank := q * h.count
	lower, prev := 0.0, 0.0
	for _, b := range h.buckets {
		if b.cum >= rank {
			if math.IsInf(b.le, 1) {
				return lower
			}
			if b.cum == prev {
				return b.le
			}
			return lower + (b.le-lower)*(rank-prev)/(b.cum-prev)
		}
		lower, prev = b.le, b.cum
	}
	return lower // above the last finite bound
}

// scraper keeps, per component id, the scrapes of the last window.
type scraper struct {
	client *http.Client
	window time.Duration

	mu      sync.Mutex
	history map[string][]sample
	errs    map[string]string // last scrape error by component
}

func newScraper(client *http.Client, window time.Duration) *scraper {
	return &scraper{client: client, window: window, history: map[string][]sample{}, errs: map[string]string{}}
}

// target is one component to scrape.
type target struct {
	id, addr string
}

// scrapeAll scrapes every target concurrently (each bounded by the
// client's timeout) and forgets components that are no longer targets.
// A failed scrape drops the component's history: a dead process's last
// numbers must not count as current.
func (s *scraper) scrapeAll(ctx context.Context, targets []target) {
	var wg sync.WaitGroup
	type result struct {
		id  string
		smp sample
		err error
	}
	results := make(chan result, len(targets))
	for _, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			smp, err := s.scrape(ctx, t.addr)
			results <- result{t.id, smp, err}
		}()
	}
	wg.Wait()
	close(results)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := map[string]bool{}
	for _, t := range targets {
		keep[t.id] = true
	}
	for id := range s.history {
		if !keep[id] {
			delete(s.history, id)
			delete(s.errs, id)
		}
	}
	for r := range results {
		if r.err != nil {
			delete(s.history, r.id)
			s.errs[r.id] = r.err.Error()
			continue
		}
		delete(s.errs, r.id)
		h := append(s.history[r.id], r.smp)
		// Keep one sample older than the window, as the base of rates.
		i := 0
		for i+1 < len(h) && now.Sub(h[i+1].at) >= s.window {
			i++
		}
		s.history[r.id] = append(h[:0:0], h[i:]...)
	}
}

func (s *scraper) scrape(ctx context.Context, addr string) (sample, error) {
	url := "http://" + scrapeHost(addr) + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return sample{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.client.Do(req)
	if err != nil {
		return sample{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return sample{}, fmt.Errorf("scrape %s: HTTP %s", url, resp.Status)
	}
	smp, err := parseMetrics(io.LimitReader(resp.Body, maxScrapeBytes), time.Now())
	if err != nil {
		return sample{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	return smp, nil
}

// scrapeHost makes a listen address dialable: a wildcard host (0.0.0.0,
// ::, empty) becomes loopback.
func scrapeHost(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// window is what the scrapes of one component say over the window.
type window struct {
	first, last sample
	ok          bool
}

func (s *scraper) windowOf(id string) (window, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.history[id]
	if len(h) == 0 {
		return window{}, s.errs[id]
	}
	return window{first: h[0], last: h[len(h)-1], ok: true}, ""
}

// rate of counter key per second over w (0 with a single scrape; a reset
// counts from zero).
func (w window) rate(key string) float64 {
	dt := w.last.at.Sub(w.first.at).Seconds()
	if !w.ok || dt <= 0 {
		return 0
	}
	d := w.last.values[key] - w.first.values[key]
	if d < 0 {
		d = w.last.values[key]
	}
	return d / dt
}

// hist is the histogram of key observed during w.
func (w window) hist(key string) hist {
	if !w.ok {
		return hist{}
	}
	if w.last.at.Equal(w.first.at) {
		return hist{}
	}
	return subHist(w.last.hists[key], w.first.hists[key])
}

// value is the newest value of key and whether it was exposed.
func (w window) value(key string) (float64, bool) {
	if !w.ok {
		return 0, false
	}
	v, ok := w.last.values[key]
	return v, ok
}
