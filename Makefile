# HAMS-Go build entry points. `make test` is the README's test command and
# what CI runs; `make bench` and `make chaos` hold the long runs.
GO        ?= go
BIN       := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)

PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2

# Packages whose tests run under the race detector (the protocol and the
# concurrent request path).
RACE_PKGS := ./internal/... ./sidecar/... ./frontend/... ./manager/...

.PHONY: all tools proto build test test-race test-rest demo bench chaos docker clean

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
	$(GO) test -count=1 $$($(GO) list ./... | grep -v -E '/(internal|sidecar|frontend|manager)(/|$$)')

demo: build
	$(BIN)/hams demo

MODES := direct,bare,nspb,remus,nspb-s1,nspb-s2

bench: build
	$(BIN)/hams bench --service all --modes $(MODES) --batch 1 --requests 400 --json bench-b1.json
	$(BIN)/hams bench --service all --modes $(MODES) --batch 16 --requests 1280 --json bench-b16.json
	$(BIN)/hams bench --service all --modes $(MODES) --batch 64 --requests 2560 --json bench-b64.json

chaos: build
	$(BIN)/hams chaos --service ap --duration 60s --seed 1 --audit chaos-audit --json chaos-ap.json

clean:
	rm -rf $(BIN)
