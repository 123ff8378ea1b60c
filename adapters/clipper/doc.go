// Package clipper is the sidecar Backend over a Clipper application's query
// frontend REST API (conventionally port 1337), for retrofitting HAMS onto
// a running Clipper deployment.
//
// A batch becomes one `POST /{app}/predict`: a single row is sent as
// {"input": [...]}, several as {"input_batch": [[...], ...]} (rows in
// batch order). The input is one tensor (Config.Input): a numeric tensor
// [N, ...] is sent row by row as flat JSON number arrays (Clipper's
// doubles / floats / ints / bytes input types); a BYTES tensor [N] is sent
// as one JSON string per row (Clipper's strings input type). Clipper
// answers one object {"query_id", "output", "default",
// "default_explanation"} for one row and {"batch_predictions": [...]} of
// such objects for several (and a bare object for a batch of one).
//
// Outputs: every row's "output" becomes row i of the output tensor
// (Config.Output, datatype Config.OutputDatatype): a JSON number gives
// shape [N], an array of D numbers [N, D] (every row the same D); with
// datatype BYTES a string output is taken verbatim and any other JSON value
// as its JSON text.
//
// "default": true means Clipper gave up on the models (latency SLO missed,
// no model linked) and answered the application's default output. That is
// not a prediction: the adapter fails the batch naming the
// default_explanation, so the sidecar and the client see an error, never a
// made-up answer. The code is DeadlineExceeded for a missed latency SLO
// and FailedPrecondition otherwise, never Unavailable: that would make the
// sidecar hold the batch as if its model server were unreachable and then
// stop for a failover, which cannot help a query frontend that is up and
// answering. A health probe that gets the default output is Unavailable.
//
// Errors: HTTP status codes map to gRPC codes (400 InvalidArgument, 404
// NotFound, 408/504 DeadlineExceeded, 413/429 ResourceExhausted, 501
// Unimplemented, 502/503 Unavailable, other 5xx Internal); Clipper's error
// body {"error", "cause"} is quoted in the message. Connection failures
// are Unavailable; Config.Timeout bounds every call (DeadlineExceeded).
// Nothing is retried: predictions may feed Clipper's online policies.
//
// Request identity: a predict made under a context that carries the
// sidecar's hamsmd.Source sends the batch's hams-req-id and
// hams-lineage-bin (base64) as HTTP headers (internal/hamsmd), for
// correlation in the query frontend's or a proxy's logs; Clipper ignores
// them.
//
// Health: `GET /metrics` on the query frontend (cheap: no model runs),
// which proves the frontend is up. With Config.HealthProbe set, a probe
// predict with that input follows and must come back without the default
// output, which proves the application's models answer within its SLO.
// The admin API (port 1338) is not used: it says what is registered, not
// whether it answers.
package clipper
