package testserver

import "syscall"

// dieWithParent makes the kernel kill a server process when the test
// process goes away (a panic on timeout skips the cleanups): no server
// outlives a run.
func dieWithParent() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
