#!/bin/bash
# The GPU checks (state memory through cudaIpcMemHandle_t) on a machine with
# an NVIDIA GPU and no Go toolchain: build the test binaries here, carry them
# there, run them there. Two bundles, because each must stay small enough to
# travel (xz-compressed test binaries of about 27 and 35 MiB).
#
#   scripts/gpu-checks.sh build          # here: .gpu1/ and .gpu2/ (git-ignored)
#   scripts/gpu-checks.sh run 1 [OUTDIR] # there, from the repository root:
#   scripts/gpu-checks.sh run 2 [OUTDIR] #   part 1 unit tests and benchmarks,
#                                        #   part 2 the integration test
# What they printed on an H100: docs/gpu/2026-11-27-h100.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
build)
	set -e
	rm -rf .gpu1 .gpu2 && mkdir -p .gpu1 .gpu2 /tmp/hams-gpu
	export CGO_ENABLED=0
	go test -c -ldflags='-s -w' -o /tmp/hams-gpu/cuda.test ./internal/cuda
	go test -c -ldflags='-s -w' -o /tmp/hams-gpu/refserver.test ./refserver
	go test -c -ldflags='-s -w' -o /tmp/hams-gpu/triton.test ./adapters/triton
	go test -c -ldflags='-s -w' -o /tmp/hams-gpu/integration.test ./integration
	go build -ldflags='-s -w' -o /tmp/hams-gpu/hams ./cmd/hams
	for f in cuda refserver triton; do xz -T0 -6 -c /tmp/hams-gpu/$f.test > .gpu1/$f.test.xz; done
	for f in integration.test hams; do xz -T0 -6 -c /tmp/hams-gpu/$f > .gpu2/$f.xz; done
	du -sh .gpu1 .gpu2
	;;
run)
	part=${2:?part 1 or 2}
	out=${3:-${OUT:-/tmp/hams-gpu-out}}
	mkdir -p "$out" /tmp/g
	unx() {
		if command -v xz >/dev/null; then xz -dc "$1" >"$2"; else
			python3 -c "import lzma,sys,shutil;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" "$1" "$2"
		fi
		chmod +x "$2"
	}
	if [ "$part" = 1 ]; then
		for f in cuda refserver triton; do unx .gpu1/$f.test.xz /tmp/g/$f.test; done
		{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; } 2>&1 | tee "$out/env.txt"
		(cd internal/cuda && timeout 120 /tmp/g/cuda.test -test.v -test.count=1) 2>&1 | tee "$out/cuda.txt"
		(cd adapters/triton && timeout 180 /tmp/g/triton.test -test.v -test.count=1 -test.run 'CUDA|StateMemory|TestChildServer') 2>&1 | tee "$out/triton.txt"
		(cd refserver && timeout 180 /tmp/g/refserver.test -test.v -test.count=1 -test.run 'Cuda|TestChildServer') 2>&1 | tee "$out/refserver.txt"
		(cd internal/cuda && timeout 120 /tmp/g/cuda.test -test.run '^$' -test.bench CopyToHost -test.benchtime 20x) 2>&1 | tee "$out/bench-cuda.txt"
		(cd adapters/triton && timeout 180 /tmp/g/triton.test -test.run '^$' -test.bench ReadState -test.benchtime 20x) 2>&1 | tee "$out/bench-triton.txt"
		! grep -h -- '--- FAIL\|^FAIL' "$out"/*.txt
	else
		unx .gpu2/integration.test.xz /tmp/g/integration.test
		unx .gpu2/hams.xz /tmp/g/hams
		(cd integration && HAMS_BIN=/tmp/g/hams timeout 400 /tmp/g/integration.test -test.v -test.count=1 -test.run '^TestTritonLSTMCudaState$') 2>&1 | tee "$out/integration.txt"
		grep -q -- '--- PASS: TestTritonLSTMCudaState ' "$out/integration.txt"
	fi
	;;
*)
	echo "usage: $0 build | run 1|2 [OUTDIR]" >&2
	exit 2
	;;
esac
