#!/usr/bin/env bash
# Regenerates the Go code of every .proto under protos/ into OUT (default:
# protos/ itself). Needs protoc plus the pinned plugins (see Makefile: tools).
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-.}
mkdir -p "$out"
files=$(find . -name '*.proto' | sed 's|^\./||' | sort)
protoc -I . -I /usr/include \
  --go_out="$out" --go_opt=paths=source_relative \
  --go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
  $files
