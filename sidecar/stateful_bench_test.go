package sidecar

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func histMean(h prometheus.Histogram) float64 {
	var m dto.Metric
	if err := h.Write(&m); err != nil || m.GetHistogram().GetSampleCount() == 0 {
		return 0
	}
	return m.GetHistogram().GetSampleSum() / float64(m.GetHistogram().GetSampleCount())
}

// BenchmarkReplicatedPrimary drives b.N requests (batches of 1) through a
// replicated primary with a 1 MiB or 16 MiB state and reports the mean
// per-batch snapshot copy and delivery (copy done -> backup ack) times.
func BenchmarkReplicatedPrimary(b *testing.B) {
	for _, mib := range []int{1, 16} {
		b.Run(fmt.Sprintf("state=%dMiB", mib), func(b *testing.B) {
			width := mib << 18
			h := startRepl(b, fmt.Sprintf(oneStateful, "nspb"), map[string]Backend{"a": newCounter(width)},
				map[string]Backend{"a": newCounter(width)}, replOpts{})
			defer h.stop()
			b.ResetTimer()
			for i := 1; i <= b.N; i++ {
				h.send(uint64(i), uint64(i))
				waitFor(b, "reply", func() bool { return h.sink.count() >= i })
			}
			waitFor(b, "durable", func() bool { return maxSeqOf(h.backups["a"]) == uint64(b.N) })
			b.StopTimer()
			m := h.sidecars["a"].metrics
			b.ReportMetric(histMean(m.snapCopy)*1e3, "copy-ms")
			b.ReportMetric(histMean(m.snapDelivery)*1e3, "deliver-ms")
			b.ReportMetric(histMean(h.backups["a"].metrics.applySeconds)*1e3, "apply-ms")
		})
	}
}

// BenchmarkSmallSnapshotTransport is one request at a time (batch 1)
// through a replicated primary with a 4 KiB state over mutual TLS, the
// snapshot of every batch shipped either on a ShipSnapshot gRPC stream
// of its own ("grpc", the default below bulkMinBytes) or on the bulk
// stream's standing connection ("bulk"); side by side in one run, it
// reports the process's CPU per request (both sidecars, the frontend
// stand-in and the embedded NATS server all run in it):
// go test ./sidecar -run '^$' -bench SmallSnapshotTransport -count 3
func BenchmarkSmallSnapshotTransport(b *testing.B) {
	defer func(n uint64) { bulkMinBytes = n }(bulkMinBytes)
	for _, tr := range []string{"grpc", "bulk"} {
		b.Run(tr, func(b *testing.B) {
			bulkMinBytes = 1 << 40
			if tr == "bulk" {
				bulkMinBytes = 0
			}
			certs := newTestCerts(b)
			h := startRepl(b, fmt.Sprintf(oneStateful, "nspb"), map[string]Backend{"a": newCounter(1024)},
				map[string]Backend{"a": newCounter(1024)}, replOpts{certs: certs})
			defer h.stop()
			const warm = 50
			for i := 1; i <= warm; i++ {
				h.send(uint64(i), uint64(i))
				waitFor(b, "reply", func() bool { return h.sink.count() >= i })
			}
			waitFor(b, "durable", func() bool { return maxSeqOf(h.backups["a"]) == warm })
			cpu0 := processCPU()
			b.ResetTimer()
			for i := warm + 1; i <= warm+b.N; i++ {
				h.send(uint64(i), uint64(i))
				waitFor(b, "reply", func() bool { return h.sink.count() >= i })
				waitFor(b, "durable", func() bool { return maxSeqOf(h.backups["a"]) == uint64(i) })
			}
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu0)/1e6/float64(b.N), "cpu-ms/req")
			if got := counterValue(h.sidecars["a"].metrics.shipBulk) > 0; got != (tr == "bulk") {
				b.Fatalf("bulk shipments: %v, want %v", got, tr == "bulk")
			}
		})
	}
}
