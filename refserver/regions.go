package refserver

import (
	"fmt"
	"sort"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/wire"
	"github.com/hams-go/hams/protos/inference"
)

// pins is what the two kinds of registered region (system and CUDA
// shared memory) share: requests pin a region while they use a window of
// it, and an unregistered region is closed when the last one ends (as
// Triton defers it). The managers hold their own mutex around every call.
type pins struct {
	refs    int
	dropped bool
}

// region is a registered region of either kind.
type region interface {
	pinsOf() *pins
	closeRegion()
}

// unregisterRegions drops name from regions (every region for ""),
// closing those no request uses; unknown names succeed, as in Triton.
func unregisterRegions[R region](regions map[string]R, name string) {
	for n, r := range regions {
		if name != "" && n != name {
			continue
		}
		delete(regions, n)
		p := r.pinsOf()
		p.dropped = true
		if p.refs == 0 {
			r.closeRegion()
		}
	}
}

// unpin ends one request's use of r, closing it if it was unregistered
// meanwhile.
func unpin(r region) {
	p := r.pinsOf()
	p.refs--
	if p.refs == 0 && p.dropped {
		r.closeRegion()
	}
}

// regionNames lists the names of regions, sorted.
func regionNames[R any](regions map[string]R) []string {
	out := make([]string, 0, len(regions))
	for n := range regions {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// windowParams reads a tensor's shared-memory parameters (the same for
// both kinds of region).
func windowParams(tensorName string, params map[string]*inference.InferParameter) (region string, off, size int64, err error) {
	region, _, err = wire.StringParam(params, wire.ParamShmRegion)
	if err == nil {
		var ok bool
		size, ok, err = wire.Int64Param(params, wire.ParamShmByteSize)
		switch {
		case err != nil:
		case !ok:
			err = fmt.Errorf("parameter %s is required with %s", wire.ParamShmByteSize, wire.ParamShmRegion)
		case size < 0:
			err = fmt.Errorf("parameter %s=%d is negative", wire.ParamShmByteSize, size)
		}
	}
	if err == nil {
		off, _, err = wire.Int64Param(params, wire.ParamShmOffset)
		if err == nil && off < 0 {
			err = fmt.Errorf("parameter %s=%d is negative", wire.ParamShmOffset, off)
		}
	}
	if err != nil {
		return "", 0, 0, status.Errorf(codes.InvalidArgument, "tensor %q: %v", tensorName, err)
	}
	return region, off, size, nil
}

// pinWindow looks the tensor's region up in regions, checks its window
// [off, off+size) against the region's size and pins the region; caller
// holds the manager's mutex.
func pinWindow[R region](regions map[string]R, sizeOf func(R) uint64, tensorName string, params map[string]*inference.InferParameter) (r R, off, size int64, err error) {
	name, off, size, err := windowParams(tensorName, params)
	if err != nil {
		return r, 0, 0, err
	}
	r, ok := regions[name]
	if !ok {
		return r, 0, 0, status.Errorf(codes.NotFound, "tensor %q: Unable to find shared memory region: '%s'", tensorName, name)
	}
	rs := sizeOf(r)
	if uint64(off) >= rs && !(off == 0 && size == 0) {
		return r, 0, 0, status.Errorf(codes.InvalidArgument, "tensor %q: Invalid offset for shared memory region: '%s' (offset %d, region of %d bytes)", tensorName, name, off, rs)
	}
	if uint64(size) > rs-uint64(off) {
		return r, 0, 0, status.Errorf(codes.InvalidArgument, "tensor %q: Invalid offset + byte size for shared memory region: '%s' (%d + %d > %d)", tensorName, name, off, size, rs)
	}
	r.pinsOf().refs++
	return r, off, size, nil
}
