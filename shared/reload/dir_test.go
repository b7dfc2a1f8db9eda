package reload_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tollgate-dev/tollgate/shared/reload"
)

// configMap is a directory that Kubernetes' atomic writer keeps: each file a link
// into ..data, ..data a link to the timestamped directory of the last update.
type configMap struct {
	t   testing.TB
	dir string
	n   int
}

// stage writes files into a new timestamped directory without publishing it (an
// update half done) and returns its name.
func (c *configMap) stage(files map[string]string) string {
	c.t.Helper()
	c.n++
	ts := fmt.Sprintf("..2026_11_27_20_00_%02d.%d", c.n%60, c.n)
	if err := os.Mkdir(filepath.Join(c.dir, ts), 0o755); err != nil {
		c.t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(c.dir, ts, name), []byte(body), 0o644); err != nil {
			c.t.Fatal(err)
		}
	}
	return ts
}

// publish swaps ..data to ts as the atomic writer does (a new link renamed over the
// old one), links each of files' names into ..data, removes the links of names no
// longer there and the previous timestamped directory.
func (c *configMap) publish(ts string, files map[string]string) {
	c.t.Helper()
	old, _ := os.Readlink(filepath.Join(c.dir, "..data"))
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		c.t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(c.dir, name)
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				c.t.Fatal(err)
			}
		}
	}
	entries, _ := os.ReadDir(c.dir)
	for _, e := range entries {
		if _, keep := files[e.Name()]; !keep && !strings.HasPrefix(e.Name(), "..") {
			os.Remove(filepath.Join(c.dir, e.Name()))
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(c.dir, old)); err != nil {
			c.t.Fatal(err)
		}
	}
}

func (c *configMap) update(files map[string]string) { c.t.Helper(); c.publish(c.stage(files), files) }

// version is the test's configuration: every file says "version: N", and a valid
// directory's files all say the same N.
func version(doc []byte) (string, error) {
	files, err := reload.DecodeDir(doc)
	if err != nil {
		return "", err
	}
	if len(files) == 0 {
		return "", fmt.Errorf("no files")
	}
	var v string
	for _, f := range files {
		got, ok := strings.CutPrefix(string(f.Data), "version: ")
		if !ok {
			return "", fmt.Errorf("%s: want version: N, got %q", f.Name, f.Data)
		}
		if v != "" && got != v {
			return "", fmt.Errorf("%s says version %s, %s", f.Name, got, v)
		}
		v = got
	}
	return v, nil
}

func versionFiles(v string, names ...string) map[string]string {
	m := map[string]string{}
	for _, n := range names {
		m[n] = "version: " + v
	}
	return m
}

// TestDirConfigMap reloads a directory updated as Kubernetes updates a mounted
// ConfigMap: a published update applies whole; one staged but not yet published is
// not seen; an invalid one is refused and the running version stays; a file added
// or removed is an update too.
func TestDirConfigMap(t *testing.T) {
	t.Parallel()
	cm := &configMap{t: t, dir: t.TempDir()}
	cm.update(versionFiles("1", "a.yaml", "b.yaml"))
	var running atomic.Value
	r, v, err := reload.LoadOf(context.Background(), reload.ConfigOf[string]{
		Source: reload.Dir{Path: cm.dir},
		Parse:  version,
		Apply:  func(v string) error { running.Store(v); return nil },
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil || v != "1" {
		t.Fatalf("LoadOf = %q, %v; want version 1", v, err)
	}
	running.Store(v)
	step := func(what, wantResult, wantVersion string) {
		t.Helper()
		result, err := r.Reload(context.Background())
		if result != wantResult {
			t.Errorf("%s: Reload() = %s, %v; want %s", what, result, err, wantResult)
		}
		if got := running.Load(); got != wantVersion {
			t.Errorf("%s: running version %v, want %s", what, got, wantVersion)
		}
	}
	step("no change", reload.Unchanged, "1")
	cm.update(versionFiles("2", "a.yaml", "b.yaml"))
	step("update to 2", reload.Applied, "2")

	// Half done: the new directory is written (one file of two so far), ..data not
	// yet swapped.
	half := versionFiles("3", "a.yaml")
	ts := cm.stage(half)
	step("update 3 staged, not published", reload.Unchanged, "2")
	os.WriteFile(filepath.Join(cm.dir, ts, "b.yaml"), []byte("version: 3"), 0o644)
	cm.publish(ts, versionFiles("3", "a.yaml", "b.yaml"))
	step("update 3 published", reload.Applied, "3")

	cm.update(map[string]string{"a.yaml": "version: 4", "b.yaml": "version: 3"})
	step("invalid update (files disagree)", reload.Invalid, "3")
	cm.update(versionFiles("5", "a.yaml", "b.yaml", "c.yaml"))
	step("a file added", reload.Applied, "5")
	cm.update(versionFiles("5", "a.yaml"))
	step("a file removed", reload.Applied, "5")
	if files, err := (reload.Dir{Path: cm.dir}).Files(); err != nil || len(files) != 1 || files[0].Name != "a.yaml" {
		t.Errorf("Files() after removing b and c = %v, %v; want a.yaml alone", files, err)
	}
}

// TestDirConfigMapSwapsUnderReads swaps ..data as fast as it can while reloads run:
// no read ever mixes two updates (the test's Parse refuses a mix as invalid); a read
// that a swap interrupts fails and the next one succeeds.
func TestDirConfigMapSwapsUnderReads(t *testing.T) {
	t.Parallel()
	cm := &configMap{t: t, dir: t.TempDir()}
	names := []string{"a.yaml", "b.yaml", "c.yaml", "d.yaml"}
	cm.update(versionFiles("0", names...))
	r, _, err := reload.LoadOf(context.Background(), reload.ConfigOf[string]{
		Source: reload.Dir{Path: cm.dir},
		Parse:  version,
		Apply:  func(string) error { return nil },
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			cm.update(versionFiles(fmt.Sprint(i), names...))
		}
	})
	results := map[string]int{}
	for range 2000 {
		result, err := r.Reload(context.Background())
		results[result]++
		if result == reload.Invalid {
			t.Errorf("Reload() = %s, %v: a read mixed two updates", result, err)
		}
	}
	close(stop)
	wg.Wait()
	if results[reload.Applied] == 0 {
		t.Errorf("results %v: no update applied while ..data was swapped", results)
	}
	t.Logf("results of 2000 reloads under swaps: %v", results)
}

// TestDirPlain reads a plain directory: subdirectories by relative name, dot files
// unless IgnoreDotFiles, and a missing directory as an error unless AllowMissing.
func TestDirPlain(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
	for name, body := range map[string]string{"a.yaml": "a", "sub/b.yaml": "b", ".hidden": "h"} {
		os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644)
	}
	names := func(d reload.Dir) string {
		t.Helper()
		files, err := d.Files()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range files {
			out = append(out, f.Name+"="+string(f.Data))
		}
		return strings.Join(out, ",")
	}
	if got, want := names(reload.Dir{Path: dir}), ".hidden=h,a.yaml=a,sub/b.yaml=b"; got != want {
		t.Errorf("Files() = %s, want %s", got, want)
	}
	if got, want := names(reload.Dir{Path: dir, IgnoreDotFiles: true}), "a.yaml=a,sub/b.yaml=b"; got != want {
		t.Errorf("Files() ignoring dot files = %s, want %s", got, want)
	}
	missing := filepath.Join(dir, "none")
	if _, err := (reload.Dir{Path: missing}).Files(); err == nil {
		t.Errorf("Files() of a missing directory = nil error, want one")
	}
	if got := names(reload.Dir{Path: missing, AllowMissing: true}); got != "" {
		t.Errorf("Files() of a missing directory, allowed = %q, want none", got)
	}
}
