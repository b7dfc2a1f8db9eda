package redistest

import "syscall"

// sysProcAttr has the kernel kill redis-server if the test binary dies
// without running its cleanups (a timeout panic, a signal).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
