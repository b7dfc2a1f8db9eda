package reload_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/configmaptest"
	"github.com/tollgate-dev/tollgate/shared/reload"
)

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
	cm := &configmaptest.Volume{T: t, Dir: t.TempDir()}
	cm.Update(versionFiles("1", "a.yaml", "b.yaml"))
	var running atomic.Value
	r, v, err := reload.LoadOf(context.Background(), reload.ConfigOf[string]{
		Source: reload.Dir{Path: cm.Dir},
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
	cm.Update(versionFiles("2", "a.yaml", "b.yaml"))
	step("update to 2", reload.Applied, "2")

	// Half done: the new directory is written (one file of two so far), ..data not
	// yet swapped.
	half := versionFiles("3", "a.yaml")
	ts := cm.Stage(half)
	step("update 3 staged, not published", reload.Unchanged, "2")
	os.WriteFile(filepath.Join(cm.Dir, ts, "b.yaml"), []byte("version: 3"), 0o644)
	cm.Publish(ts, versionFiles("3", "a.yaml", "b.yaml"))
	step("update 3 published", reload.Applied, "3")

	cm.Update(map[string]string{"a.yaml": "version: 4", "b.yaml": "version: 3"})
	step("invalid update (files disagree)", reload.Invalid, "3")
	cm.Update(versionFiles("5", "a.yaml", "b.yaml", "c.yaml"))
	step("a file added", reload.Applied, "5")
	cm.Update(versionFiles("5", "a.yaml"))
	step("a file removed", reload.Applied, "5")
	if files, err := (reload.Dir{Path: cm.Dir}).Files(); err != nil || len(files) != 1 || files[0].Name != "a.yaml" {
		t.Errorf("Files() after removing b and c = %v, %v; want a.yaml alone", files, err)
	}
}

// TestDirConfigMapSwapsUnderReads swaps ..data as fast as it can while reloads run:
// no read ever mixes two updates (the test's Parse refuses a mix as invalid); a read
// that a swap interrupts fails, and once the swaps stop the next read succeeds and
// applies the last update.
func TestDirConfigMapSwapsUnderReads(t *testing.T) {
	t.Parallel()
	cm := &configmaptest.Volume{T: t, Dir: t.TempDir()}
	names := []string{"a.yaml", "b.yaml", "c.yaml", "d.yaml"}
	cm.Update(versionFiles("0", names...))
	var running, last atomic.Value
	last.Store("0")
	r, _, err := reload.LoadOf(context.Background(), reload.ConfigOf[string]{
		Source: reload.Dir{Path: cm.Dir},
		Parse:  version,
		Apply:  func(v string) error { running.Store(v); return nil },
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
			cm.Update(versionFiles(fmt.Sprint(i), names...))
			last.Store(fmt.Sprint(i))
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
	if result, err := r.Reload(context.Background()); result != reload.Applied && result != reload.Unchanged {
		t.Errorf("Reload() after the swaps stopped = %s, %v; want applied or unchanged", result, err)
	}
	if got, want := running.Load(), last.Load(); got != want {
		t.Errorf("running version after the swaps stopped = %v, want the last update's, %v", got, want)
	}
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

// FuzzDecodeDir decodes any document without panicking, and every document it
// accepts round-trips: its files, encoded as Dir.Read encodes them (JSON), decode
// to the same files.
func FuzzDecodeDir(f *testing.F) {
	f.Add([]byte(`[{"name":"a.yaml","data":"ZG9tYWluOiBk"}]`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"name":1}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		files, err := reload.DecodeDir(doc)
		if err != nil {
			return
		}
		again, err := json.Marshal(files)
		if err != nil {
			t.Fatalf("json.Marshal(%v) = %v", files, err)
		}
		back, err := reload.DecodeDir(again)
		if err != nil || !reflect.DeepEqual(back, files) {
			t.Errorf("DecodeDir(%s) = %v, %v; want %v", again, back, err, files)
		}
	})
}
