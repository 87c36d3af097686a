//go:build !linux

package testserver

import "syscall"

// dieWithParent: only Linux has a parent-death signal; elsewhere the
// cleanups stop the servers.
func dieWithParent() *syscall.SysProcAttr { return nil }
