package manager

// KeepLeaseOnStop makes Run end without releasing the lease, as a crash
// would. Call before Run.
func (m *Manager) KeepLeaseOnStop() { m.keepLease = true }
