package sinks

// NoDirect makes s send every request through its transport, as it does
// for requests whose lane does not gate writes (direct.go): for the tests
// of the transport's own gate (wireConn.Write).
func NoDirect(s *HTTP) { s.direct = nil }
