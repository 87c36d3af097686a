//go:build !unix

package sinks

// alive cannot peek here: a connection the server closed fails its write
// or its response, as through the transport.
func (c *directConn) alive() bool { return c.br.Buffered() == 0 }
