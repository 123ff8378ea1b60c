# HAMS-Go build entry points. `make test` is the README's test command and
# what CI runs; `make bench` and `make chaos` hold the long runs.
GO        ?= go
BIN       := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)

PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2

# Packages whose tests run under the race detector (the protocol and the
# concurrent request path).
RACE_PKGS := ./internal/... ./sidecar/... ./frontend/... ./manager/... ./protocol/...

.PHONY: all tools proto build test test-race test-rest demo bench bench-paper bench-parm recovery chaos netem-straggler fuzz chaos-timing chaos-net chaos-nats docker clean

all: build

tools: $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc

$(BIN)/protoc-gen-go:
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(BIN)/protoc-gen-go-grpc:
	GOBIN=$(BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

# Regenerates protos/**/*.pb.go (needs protoc: apt-get install protobuf-compiler).
proto: tools
	protos/gen.sh

build:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/hams ./cmd/hams

test: tools
	$(GO) vet ./...
	$(GO) test -race -count=1 $(RACE_PKGS)
	$(GO) test -count=1 $$($(GO) list ./... | grep -v -E '/(internal|sidecar|frontend|manager|protocol)(/|$$)')

demo: build
	$(BIN)/hams demo

# The image of docker-compose.yml: the static binary (no libc, no libcuda)
# and the examples, FROM scratch (docs/docker.md).
docker:
	CGO_ENABLED=0 $(GO) build -tags nocuda -o $(BIN)/hams-static ./cmd/hams
	docker build -t hams-go:latest .

MODES := direct,bare,nspb,remus,nspb-s1,nspb-s2

bench: build
	$(BIN)/hams bench --service all --modes $(MODES) --batch 1 --requests 400 --json bench-b1.json
	$(BIN)/hams bench --service all --modes $(MODES) --batch 16 --requests 1280 --json bench-b16.json
	$(BIN)/hams bench --service all --modes $(MODES) --batch 64 --requests 2560 --json bench-b64.json

# The issue-3 measurement (docs/measurements.md): paper-scale models, one
# batch crossing the graph at a time (the paper's latency), backups and the
# coordination engine on CPUs of their own (the paper's separate hosts).
PAPER_MODES := bare,nspb,remus,nspb-s1,nspb-s2
PAPER := --examples paper --load waves --isolate-replicas --modes $(PAPER_MODES)

bench-paper: build
	$(BIN)/hams bench --service all $(PAPER) --batch 64 --requests 1280 --json bench-paper-b64.json --plot bench-paper-b64.png
	$(BIN)/hams bench --service all $(PAPER) --batch 16 --requests 320 --json bench-paper-b16.json --plot bench-paper-b16.png
	$(BIN)/hams bench --service all $(PAPER) --batch 1 --requests 200 --json bench-paper-b1.json --plot bench-paper-b1.png
	$(BIN)/hams report bench --plot bench-paper.png bench-paper-b1.json bench-paper-b16.json bench-paper-b64.json

# Recovery at the client per service and mode (the shape of the paper's
# Table II): stateful primary kills only, then one table.
RECOVERY_SERVICES := sa sp ap fd olv olm
RECOVERY_MODES := nspb remus replay

recovery: build
	mkdir -p recovery
	for s in $(RECOVERY_SERVICES); do for m in $(RECOVERY_MODES); do \
		$(BIN)/hams chaos --service $$s --mode $$m --kinds primary --duration 40s --seed 1 --json recovery/$$s-$$m.json || true; \
	done; done
	$(BIN)/hams report recovery recovery/*.json

chaos: build
	$(BIN)/hams chaos --service ap --duration 60s --seed 1 --audit chaos-audit --json chaos-ap.json
	$(BIN)/hams chaos --service olv --duration 60s --seed 1 --audit chaos-audit-olv --json chaos-olv.json

# The ParM measurement (docs/parm.md): none, er, hedge and parm arms of a
# replica pool with one straggling replica, interleaved, open-loop Poisson
# arrivals; k = 2, 3, 4 at batch 1, then batches 2 and 4 at k = 2.
bench-parm: build
	$(BIN)/hams bench --service parm --redundancy none,er,hedge,parm --k 2,3,4 --batch 1 --decode-after 0,5ms --requests 3000 --json bench-parm.json --plot bench-parm.png
	$(BIN)/hams bench --service parm --redundancy none,er,hedge,parm --k 2 --batch 2,4 --requests 3000 --json bench-parm-batch.json

# A real network straggler for a ParM pool (root; ip, tc with the netem
# qdisc, curl): one replica in a network namespace of its own behind
# `tc netem delay 30ms 10ms` on a veth pair, the rest of the deployment in a
# second namespace; a short load on a pool without redundancy and on a ParM
# pool over the same replicas, then everything is removed
# (scripts/netem-straggler.sh --help; NETEM_ARGS=serve keeps the delayed
# replica up for a deployment of your own).
netem-straggler: build
	scripts/netem-straggler.sh --hams $(BIN)/hams $(NETEM_ARGS)

# Native Go fuzzing of every decoder that reads outside bytes (package:
# target), FUZZTIME each (a long run: FUZZTIME=5m). The seed corpora
# (testdata/fuzz/<target>) also run in `make test`; a crash stops the run
# with its input written to the package's testdata/fuzz/<target>, where it
# stays as a regression seed once fixed. scripts/fuzz-corpus.sh adds
# inputs the fuzzer found interesting to a seed corpus. Minimizing a new
# input is bounded (FUZZMINIMIZE): the YAML target's inputs are slow to
# minimize and would stall the run otherwise.
FUZZTIME     ?= 30s
FUZZMINIMIZE ?= 10s
FUZZ_TARGETS := \
	./frontend:FuzzHTTPPredictJSON ./frontend:FuzzPassRaw ./frontend:FuzzRESTJSON \
	./internal/wire:FuzzTensorProto ./internal/wire:FuzzKServeInfer \
	./sidecar:FuzzBulkStream ./sidecar:FuzzSnapshotHeader \
	./internal/coord:FuzzRequestRecord ./internal/coord:FuzzCheckpoint \
	./manager:FuzzTopologyRecord ./internal/hamsmd:FuzzLineageMetadata \
	./internal/config:FuzzConfigYAML \
	./adapters/clipper:FuzzFastNumbers ./adapters/clipper:FuzzDecodeAnswer

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "== $$name ($$pkg, $(FUZZTIME))"; \
		$(GO) test $$pkg -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE); \
	done

# Partitions with real networks (root: namespaces, veth, iptables): every
# case of integration/partition_test.go, with its stall table.
# The failover-time targets of issue 18 (leading frontend p50 100 ms,
# manager 250 ms), held on a quiet machine; the default suite holds looser
# bounds (integration/control_failover_test.go).
chaos-timing:
	HAMS_STRICT_TIMING=1 $(GO) test ./integration -run 'TestControlPlaneKillStall' -count=1 -v -timeout 10m

chaos-net:
	HAMS_CHAOS_NET=1 $(GO) test ./integration -run 'TestPartitions|TestModelServerRestartedInPlaceIsFailedOver' -count=1 -v -timeout 20m

# NATS cluster node kills (three servers, every stream R3): in process
# (internal/natsd, graceful shutdown of a follower, the meta leader, the
# durability stream's leader) and `hams up --nats-cluster 3` under checked
# load (SIGKILL of each); the disk-full case needs root (a tmpfs).
chaos-nats:
	HAMS_CHAOS_NATS=1 $(GO) test ./internal/natsd -run 'TestClusterNodeKills|TestDiskFullRecovers' -count=1 -v -timeout 5m
	HAMS_CHAOS_NATS=1 $(GO) test ./integration -run 'TestNATSClusterNodeKills' -count=1 -v -timeout 10m

# The soak: 30 minutes of every fault kind under load (SIGKILL of every
# process kind and of NATS, freezes, partitions; root for partitions),
# then the global consistency check: zero lost, zero conflicting replies.
SOAK ?= 30m
soak: build
	$(BIN)/hams chaos --service ap --duration $(SOAK) --seed 18 --kinds primary,backup,stateless,frontend,manager,nats,freeze,partition --json soak.json

clean:
	rm -rf $(BIN)

# The per-role docker compose deployment (docs/docker.md): hams-go plus the
# compose helper. compose-gen rewrites docker-compose.yml from examples/ap.yaml.
.PHONY: compose-image compose-gen compose-chaos
compose-image: docker
	mkdir -p $(BIN)/compose
	CGO_ENABLED=0 $(GO) build -o $(BIN)/compose/hams-compose ./deploy/compose/hamscompose
	docker build -t hams-go-compose:latest -f deploy/compose/Dockerfile $(BIN)/compose

compose-gen:
	$(GO) run ./deploy/compose/hamscompose gen --config examples/ap.yaml --out docker-compose.yml

# The compose chaos test: the per-role deployment under load, one fault per
# case (kills, a pause, a partition), the checker over the audit logs.
compose-chaos: compose-image
	HAMS_COMPOSE_CHAOS=1 $(GO) test ./integration -run TestComposeChaos -count=1 -v -timeout 30m
