// Package repo finds the tollgate repository the developer tools run against. The
// tools are a module of their own (scripts/go.mod), so the nearest go.mod above the
// working directory may be theirs; the repository's root is the directory whose
// go.mod declares the product's module.
package repo

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Module is the product's module path.
const Module = "github.com/tollgate-dev/tollgate"

// Root returns the nearest directory at or above dir whose go.mod declares Module.
func Root(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("repo: %w", err)
	}
	for {
		if declares(filepath.Join(dir, "go.mod")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repo: no go.mod of " + Module + " above the working directory: run from the tollgate repository")
		}
		dir = parent
	}
}

// Chdir makes the repository's root the working directory, so that a tool's paths
// (lambda/policy.yaml, dist/bench, ./lambda/limiter) mean the same wherever it was
// started from: `make bench`, `go -C scripts run ./bench` or scripts/bench itself.
func Chdir() error {
	wd, err := os.Getwd()
	if err != nil {
		return fmt.Errorf("repo: %w", err)
	}
	root, err := Root(wd)
	if err != nil {
		return err
	}
	if err := os.Chdir(root); err != nil {
		return fmt.Errorf("repo: %w", err)
	}
	return nil
}

// declares reports whether the go.mod at path declares Module.
func declares(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(name), `"`) == Module
		}
	}
	return false
}
