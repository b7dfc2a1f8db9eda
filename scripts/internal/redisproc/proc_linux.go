package redisproc

import "syscall"

// procAttr makes the kernel kill redis-server if the bench dies first, so that no
// server is left behind even on a crash.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
