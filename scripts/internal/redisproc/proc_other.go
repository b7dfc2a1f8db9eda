//go:build !linux

package redisproc

import "syscall"

func procAttr() *syscall.SysProcAttr { return nil }
