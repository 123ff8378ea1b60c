package grpcx

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Undecodable requests. grpc-go answers a request message its codec
// cannot decode (malformed protobuf, a string field with invalid UTF-8)
// with Internal, as if the server had failed; it is the caller's
// message that is wrong, so every HAMS server answers InvalidArgument,
// naming the method and what the decoder found. The server's codec
// (decodeCodec) does not fail such a message: it empties it and notes
// the error against it, and the first interceptor of the chain
// (unaryDecodeCheck, and for streams RecvMsg of checkedStream) answers
// InvalidArgument before any handler sees the message. The note is
// taken out as soon as the message reaches the interceptor, which the
// codec's call precedes immediately on both paths.

// decodeCodec is the proto codec of a server that notes undecodable
// messages instead of failing them.
type decodeCodec struct {
	base encoding.CodecV2
	bad  sync.Map // message pointer -> decode error
}

func newDecodeCodec() *decodeCodec {
	return &decodeCodec{base: encoding.GetCodecV2("proto")}
}

func (c *decodeCodec) Name() string { return c.base.Name() }

func (c *decodeCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

func (c *decodeCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.base.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err // not a message grpc-go should have given a proto codec
	}
	proto.Reset(m)
	c.bad.Store(v, err)
	return nil
}

// take returns (and forgets) the decode error noted for m.
func (c *decodeCodec) take(m any) error {
	if e, ok := c.bad.LoadAndDelete(m); ok {
		return e.(error)
	}
	return nil
}

func malformed(method string, err error) error {
	return status.Errorf(codes.InvalidArgument, "%s: malformed request message: %v", method, err)
}

func (c *decodeCodec) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := c.take(req); err != nil {
		return nil, malformed(info.FullMethod, err)
	}
	return handler(ctx, req)
}

func (c *decodeCodec) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &checkedStream{ServerStream: ss, c: c, method: info.FullMethod})
}

// checkedStream answers InvalidArgument for an undecodable stream message.
type checkedStream struct {
	grpc.ServerStream
	c      *decodeCodec
	method string
}

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if err := s.c.take(m); err != nil {
		return malformed(s.method, err)
	}
	return nil
}
