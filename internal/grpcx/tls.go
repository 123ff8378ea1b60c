package grpcx

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/hams-go/hams/internal/pki"
)

// ServerTLS is the transport credential of an internal server: mutual
// TLS with src's certificate, peers verified against its CA by identity
// (pki.Source.ServerConfig). What a verified peer may call is the
// authorizer's (internal/authz).
func ServerTLS(src *pki.Source) grpc.ServerOption {
	return grpc.Creds(credentials.NewTLS(src.ServerConfig()))
}

// DialTLS is the transport credential of an internal client (it replaces
// DialOptions' plaintext: a later WithTransportCredentials wins).
func DialTLS(src *pki.Source) grpc.DialOption {
	return grpc.WithTransportCredentials(credentials.NewTLS(src.ClientConfig()))
}
