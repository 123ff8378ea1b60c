package authz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/pki"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Sentinel errors.
var (
	ErrDenied      = errors.New("authz: permission denied")
	ErrUnverified  = errors.New("authz: no verified caller identity")
	ErrConfig      = errors.New("authz: invalid config")
	errNoRule      = errors.New("no rule names this method")
	errWrongRole   = errors.New("the caller's role may not call it")
	errNoRelation  = errors.New("the caller does not stand in the required relation")
	errNoFacts     = errors.New("the server has no facts to check the relation")
	errRequestType = errors.New("unexpected request type")
)

// Facts are what a server knows of the deployment beyond identities.
type Facts interface {
	// Feeds reports whether caller is a predecessor of this server in
	// the service graph (a sidecar of a model whose outputs reach this
	// server's model, the frontend for an entry model).
	Feeds(caller pki.Identity) bool
	// RegisteredBy reports whether component id was registered by the
	// caller (the manager's registrations).
	RegisteredBy(id string, caller pki.Identity) bool
	// Sink reports whether this server's model feeds the frontend.
	Sink() bool
}

// Config of an Authorizer.
type Config struct {
	// Self is the server's identity (its deployment and model).
	Self pki.Identity
	// Facts may be nil where no rule the server serves needs them.
	Facts Facts
	// Rules default to Table.
	Rules  []Rule
	Logger *slog.Logger
}

// Authorizer checks calls against the table.
type Authorizer struct {
	self   pki.Identity
	facts  Facts
	exact  map[string]*Rule
	prefix map[string]*Rule // service name + "/" -> rule of "<service>/*"
	log    *slog.Logger
}

// New builds an Authorizer; it does no I/O.
func New(cfg Config) (*Authorizer, error) {
	if err := cfg.Self.Validate(); err != nil {
		return nil, fmt.Errorf("%w: self: %v", ErrConfig, err)
	}
	rules := cfg.Rules
	if rules == nil {
		rules = Table
	}
	a := &Authorizer{self: cfg.Self, facts: cfg.Facts, exact: map[string]*Rule{}, prefix: map[string]*Rule{}, log: cfg.Logger}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	for i := range rules {
		r := &rules[i]
		if p, ok := strings.CutSuffix(r.Method, "*"); ok {
			a.prefix[p] = r
		} else {
			if a.exact[r.Method] != nil {
				return nil, fmt.Errorf("%w: two rules for %s", ErrConfig, r.Method)
			}
			a.exact[r.Method] = r
		}
	}
	return a, nil
}

func (a *Authorizer) rule(method string) *Rule {
	if r := a.exact[method]; r != nil {
		return r
	}
	if i := strings.LastIndexByte(method, '/'); i > 0 {
		return a.prefix[method[:i+1]]
	}
	return nil
}

// Allow decides whether caller may call method with req (req may be nil
// for streams and non-gRPC surfaces: no rule of theirs reads it). The
// error wraps ErrDenied and says why.
func (a *Authorizer) Allow(method string, caller pki.Identity, req any) error {
	r := a.rule(method)
	if r == nil {
		return fmt.Errorf("%w: %v calling %s: %w", ErrDenied, caller, method, errNoRule)
	}
	if caller.Deployment != a.self.Deployment {
		return fmt.Errorf("%w: %v calling %s: the caller belongs to deployment %q", ErrDenied, caller, method, caller.Deployment)
	}
	if !slices.Contains(r.Roles, caller.Role) {
		return fmt.Errorf("%w: %v calling %s: %w (allowed: %v)", ErrDenied, caller, method, errWrongRole, r.Roles)
	}
	if r.Relation == AnyOfRole || slices.Contains(r.Exempt, caller.Role) {
		return nil
	}
	if err := a.relation(r.Relation, caller, req); err != nil {
		return fmt.Errorf("%w: %v calling %s: %s: %w", ErrDenied, caller, method, r.Relation, err)
	}
	return nil
}

func (a *Authorizer) relation(rel Relation, caller pki.Identity, req any) error {
	switch rel {
	case SameModel:
		if a.self.Model != "" && caller.Role == pki.RoleSidecar && caller.ServesModel(a.self.Model) {
			return nil
		}
	case HostedModel:
		if caller.Role == pki.RoleSidecar && caller.Model != "" && a.self.ServesModel(caller.Model) {
			return nil
		}
	case Predecessor:
		if a.facts == nil {
			return errNoFacts
		}
		if a.facts.Feeds(caller) {
			return nil
		}
	case SelfRegistration:
		r, ok := req.(*hamsv1.RegisterRequest)
		if !ok {
			return fmt.Errorf("%w %T", errRequestType, req)
		}
		if kindRole(r.GetKind()) == caller.Role && (caller.Role == pki.RoleFrontend || caller.Role == pki.RoleManager || caller.ServesModel(r.GetModel())) {
			return nil
		}
	case SinkResend:
		r, ok := req.(*hamsv1.ResendRequest)
		if !ok {
			return fmt.Errorf("%w %T", errRequestType, req)
		}
		if a.facts == nil {
			return errNoFacts
		}
		if caller.Role == pki.RoleFrontend && r.GetToModel() == config.Frontend && a.facts.Sink() {
			return nil
		}
	case OwnModelReport:
		r, ok := req.(*hamsv1.FailureReport)
		if !ok {
			return fmt.Errorf("%w %T", errRequestType, req)
		}
		if a.facts == nil {
			return errNoFacts
		}
		if caller.Role == pki.RoleSidecar && r.GetModel() != "" && caller.ServesModel(r.GetModel()) && a.facts.RegisteredBy(r.GetReporter(), caller) {
			return nil
		}
	case SelfID:
		r, ok := req.(*hamsv1.HeartbeatRequest)
		if !ok {
			return fmt.Errorf("%w %T", errRequestType, req)
		}
		if a.facts == nil {
			return errNoFacts
		}
		if a.facts.RegisteredBy(r.GetId(), caller) {
			return nil
		}
	}
	return errNoRelation
}

// kindRole is the identity role that registers as kind.
func kindRole(k hamsv1.ComponentKind) pki.Role {
	switch k {
	case hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR:
		return pki.RoleSidecar
	case hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND:
		return pki.RoleFrontend
	case hamsv1.ComponentKind_COMPONENT_KIND_MODEL_SERVER:
		return pki.RoleModelServer
	case hamsv1.ComponentKind_COMPONENT_KIND_MANAGER:
		return pki.RoleManager
	}
	return pki.RoleUnknown
}

// RegistrationMatches reports whether a registration of kind and model
// could have been made by caller (what the manager keeps to answer
// RegisteredBy for later heartbeats).
func RegistrationMatches(kind hamsv1.ComponentKind, model string, caller pki.Identity) bool {
	return kindRole(kind) == caller.Role && (caller.Role == pki.RoleFrontend || caller.Role == pki.RoleManager || caller.ServesModel(model))
}

// PeerIdentity is the verified identity of a gRPC call's peer (its
// mutual-TLS certificate).
func PeerIdentity(ctx context.Context) (pki.Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return pki.Identity{}, fmt.Errorf("%w: no peer", ErrUnverified)
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return pki.Identity{}, fmt.Errorf("%w: the connection from %v is not mutual TLS", ErrUnverified, p.Addr)
	}
	id, err := pki.IdentityOf(ti.State)
	if err != nil {
		return pki.Identity{}, fmt.Errorf("%w: %v", ErrUnverified, err)
	}
	return id, nil
}

func (a *Authorizer) check(ctx context.Context, method string, req any) error {
	caller, err := PeerIdentity(ctx)
	if err != nil {
		return status.Errorf(codes.Unauthenticated, "%s: %v", method, err)
	}
	if err := a.Allow(method, caller, req); err != nil {
		a.log.Warn("internal RPC refused", "method", method, "caller", caller.String(), "err", err)
		return status.Error(codes.PermissionDenied, err.Error())
	}
	return nil
}

// UnaryInterceptor refuses unauthorized unary calls with PermissionDenied
// (Unauthenticated without a verified identity).
func (a *Authorizer) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := a.check(ctx, info.FullMethod, req); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor is UnaryInterceptor's counterpart (no stream rule
// reads a request).
func (a *Authorizer) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := a.check(ss.Context(), info.FullMethod, nil); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// ServerOptions installs a's interceptors (after the ones already
// chained: metrics and logs see the refusals).
func (a *Authorizer) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(a.UnaryInterceptor()), grpc.ChainStreamInterceptor(a.StreamInterceptor())}
}
