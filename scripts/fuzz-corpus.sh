#!/bin/sh
# fuzz-corpus.sh PKG FUZZNAME [N]: copies N inputs (default 24, spread
# over the sizes under 4 KiB) that `go test -fuzz` found interesting for
# FUZZNAME in package PKG (./internal/wire, ...) from the fuzz cache into
# PKG/testdata/fuzz/FUZZNAME, the seed corpus `go test` runs (make test)
# and `make fuzz` starts from. Files already there are kept.
set -eu
pkg=$1 name=$2 n=${3:-24}
imp=$(go list "$pkg")
src=$(go env GOCACHE)/fuzz/$imp/$name
dst=$pkg/testdata/fuzz/$name
[ -d "$src" ] || { echo "fuzz-corpus: no cached corpus at $src (run make fuzz first)" >&2; exit 1; }
mkdir -p "$dst"
find "$src" -type f -size -4k -printf '%s %p\n' | sort -n |
	awk -v n="$n" '{ f[NR] = $2 } END { if (NR <= n) { for (i = 1; i <= NR; i++) print f[i] } else { for (i = 0; i < n; i++) print f[1 + int(i * (NR - 1) / (n - 1))] } }' |
	while read -r f; do
	cp "$f" "$dst/"
done
echo "fuzz-corpus: $(ls "$dst" | wc -l) files in $dst"
