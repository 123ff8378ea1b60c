package coord

import "time"

// OpTimeout bounds a JetStream call made without a context deadline (the
// backups' durability announcements, completion notices, reply records):
// when the NATS server dies, a publish in flight never gets its
// acknowledgement, and the caller only retries once this expires. The
// client library's default (5 s) equals a request's whole deadline, so
// every request in flight when NATS restarts used to miss it; at 1 s the
// retry (idempotent: message ids, first-writer-wins records) lands well
// within it. Calls with a context deadline keep theirs.
const OpTimeout = time.Second
