// Package configmaptest keeps a directory as Kubernetes keeps a mounted ConfigMap, for
// tests of what reads one: each file a symbolic link into ..data, ..data a link to
// the timestamped directory of the last update, swapped atomically (a new link
// renamed over the old) once that directory is written whole.
package configmaptest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A Volume is a ConfigMap's volume at Dir.
type Volume struct {
	T   testing.TB
	Dir string
	n   int
}

// Stage writes files into a new timestamped directory without publishing it (an
// update half done) and returns its name.
func (v *Volume) Stage(files map[string]string) string {
	v.T.Helper()
	v.n++
	ts := fmt.Sprintf("..2026_11_27_20_00_%02d.%d", v.n%60, v.n)
	if err := os.MkdirAll(filepath.Join(v.Dir, ts), 0o755); err != nil {
		v.T.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(v.Dir, ts, name), []byte(body), 0o644); err != nil {
			v.T.Fatal(err)
		}
	}
	return ts
}

// Publish swaps ..data to ts as Kubernetes' atomic writer does, links each of
// files' names into ..data, removes the links of names no longer there, and the
// previous timestamped directory.
func (v *Volume) Publish(ts string, files map[string]string) {
	v.T.Helper()
	old, _ := os.Readlink(filepath.Join(v.Dir, "..data"))
	tmp := filepath.Join(v.Dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		v.T.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.Dir, "..data")); err != nil {
		v.T.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(v.Dir, name)
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				v.T.Fatal(err)
			}
		}
	}
	entries, _ := os.ReadDir(v.Dir)
	for _, e := range entries {
		if _, keep := files[e.Name()]; !keep && !strings.HasPrefix(e.Name(), "..") {
			os.Remove(filepath.Join(v.Dir, e.Name()))
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(v.Dir, old)); err != nil {
			v.T.Fatal(err)
		}
	}
}

// Update stages files and publishes them: one ConfigMap update.
func (v *Volume) Update(files map[string]string) {
	v.T.Helper()
	v.Publish(v.Stage(files), files)
}
