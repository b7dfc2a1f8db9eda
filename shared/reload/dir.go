package reload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/tollgate-dev/tollgate/shared/policy"
)

// Dir is a directory of configuration files read as one document: every regular
// file in it and in its subdirectories, by its path relative to the directory. A
// change to any file, or a file added or removed, is a new document, so a Reloader
// applies the whole directory or none of it.
//
// A directory that Kubernetes mounts from a ConfigMap holds each file as a symbolic
// link into ..data, itself a link to a timestamped directory that an update writes
// whole and then swaps ..data to, atomically. Dir reads such a directory through one
// resolution of ..data, so a read sees the files of one update, never a mix of two;
// the ..data link and the timestamped directories are never read as files of their
// own. A read that a swap interrupts (the old directory removed under it) fails,
// and the next read sees the new update.
type Dir struct {
	// Path is the directory. Symbolic links on the way are resolved at each read,
	// so a path whose parent is swapped as a whole (envoyproxy/ratelimit's
	// RUNTIME_ROOT) is read at its current target.
	Path string
	// IgnoreDotFiles skips files and directories whose names start with a dot (the
	// names Kubernetes gives its own entries, which start with two, are skipped
	// always).
	IgnoreDotFiles bool
	// AllowMissing reads a directory that does not exist as an empty one.
	AllowMissing bool
}

// A DirFile is one file of a Dir's document.
type DirFile struct {
	// Name is the file's path relative to the directory, with / between names.
	Name string `json:"name"`
	Data []byte `json:"data"`
}

// Name returns the directory's path.
func (d Dir) Name() string { return d.Path }

// Read returns the directory's files as one document, which DecodeDir reads back.
func (d Dir) Read(ctx context.Context) ([]byte, error) {
	files, err := d.Files()
	if err != nil {
		return nil, err
	}
	return json.Marshal(files)
}

// DecodeDir returns the files of a document Dir.Read returned.
func DecodeDir(doc []byte) ([]DirFile, error) {
	var files []DirFile
	if err := json.Unmarshal(doc, &files); err != nil {
		return nil, fmt.Errorf("reload: not a directory's document: %w", err)
	}
	return files, nil
}

// k8sData is the link through which Kubernetes' atomic writer publishes a volume's
// files.
const k8sData = "..data"

// Files reads the directory's files, sorted by name. A file larger than
// policy.MaxSize is an error that names it.
func (d Dir) Files() ([]DirFile, error) {
	root, err := filepath.EvalSymlinks(d.Path)
	if errors.Is(err, fs.ErrNotExist) && d.AllowMissing {
		return []DirFile{}, nil
	}
	if err != nil {
		return nil, err
	}
	// A Kubernetes volume: its files are those of the directory ..data names now.
	// Resolve it once and read only there. When ..data is there but does not
	// resolve (a swap removed the directory it named meanwhile), the read fails:
	// reading the volume's own links instead would follow ..data anew for each
	// file and could mix two updates.
	data := filepath.Join(root, k8sData)
	volume := false
	if _, err := os.Lstat(data); err == nil {
		if root, err = filepath.EvalSymlinks(data); err != nil {
			return nil, fmt.Errorf("resolve %s: %w (a ConfigMap update under way; the next read retries)", data, err)
		}
		volume = true
	}
	files := []DirFile{}
	err = filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == root {
			return nil
		}
		name := e.Name()
		if strings.HasPrefix(name, "..") || (d.IgnoreDotFiles && strings.HasPrefix(name, ".")) {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if e.IsDir() {
			return nil
		}
		info, err := os.Stat(path) // through a link to the file it names
		if err != nil {
			return err
		}
		if info.IsDir() {
			return nil // a link to a directory is not followed, as envoyproxy/ratelimit does not
		}
		if info.Size() > policy.MaxSize {
			return fmt.Errorf("%s: %d bytes, more than the %d a file may hold", path, info.Size(), policy.MaxSize)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		files = append(files, DirFile{Name: filepath.ToSlash(rel), Data: data})
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The atomic writer removes the directory ..data named only once ..data names
	// another: when ..data still names root, nothing was removed under the walk.
	if volume {
		if now, err := filepath.EvalSymlinks(data); err != nil || now != root {
			return nil, fmt.Errorf("%s changed while it was read (a ConfigMap update under way; the next read retries)", data)
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	return files, nil
}
