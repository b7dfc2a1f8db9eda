package main

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/tollgate-dev/tollgate/scripts/internal/repo"
)

// testOptions builds the host's platform into a temporary directory, with labels
// fixed by the test.
func testOptions(t *testing.T) options {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err := repo.Root(wd)
	if err != nil {
		t.Fatal(err)
	}
	return options{
		root:      root,
		out:       t.TempDir(),
		platforms: []v1.Platform{{OS: "linux", Architecture: runtime.GOARCH}},
		caFile:    "/etc/ssl/certs/ca-certificates.crt",
		version:   "v9.8.7-test",
		revision:  "0123456789abcdef0123456789abcdef01234567",
		source:    defaultRepo,
		created:   time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}

// TestImage builds the image and opens it as a runtime would: from the layout's
// index to the host's image, its config (entrypoint, user, ports, labels), its
// layer (the binary executable, the ERL-named link, the CA bundle, no shell), and
// runs the binary taken out of the layer.
func TestImage(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the image's binary is a linux binary; this test runs it")
	}
	o := testOptions(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	res, err := build(ctx, o)
	if err != nil {
		t.Fatalf("build() = %v", err)
	}

	p, err := layout.FromPath(res.layout)
	if err != nil {
		t.Fatalf("layout.FromPath(%s) = %v", res.layout, err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	topManifest, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(topManifest.Manifests) != 1 {
		t.Fatalf("index.json lists %d manifests, want 1 (the image index)", len(topManifest.Manifests))
	}
	d := topManifest.Manifests[0]
	if d.MediaType != types.OCIImageIndex || d.Digest != res.index {
		t.Errorf("index.json entry = %s %s, want %s %s", d.MediaType, d.Digest, types.OCIImageIndex, res.index)
	}
	if got := d.Annotations["org.opencontainers.image.ref.name"]; got != o.version {
		t.Errorf("ref.name = %q, want %q", got, o.version)
	}
	idx, err := top.ImageIndex(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Platform == nil || im.Manifests[0].Platform.Architecture != runtime.GOARCH || im.Manifests[0].Platform.OS != "linux" {
		t.Fatalf("image index manifests = %+v, want one for linux/%s", im.Manifests, runtime.GOARCH)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type = %s, want %s", mt, types.OCIManifestSchema1)
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cf.Config.Entrypoint, " "); got != binaryPath {
		t.Errorf("Entrypoint = %q, want %q", got, binaryPath)
	}
	if len(cf.Config.Cmd) != 0 {
		t.Errorf("Cmd = %q, want none", cf.Config.Cmd)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("User = %q, want 65532:65532", cf.Config.User)
	}
	for _, port := range []string{"8080/tcp", "8081/tcp", "6070/tcp"} {
		if _, ok := cf.Config.ExposedPorts[port]; !ok {
			t.Errorf("ExposedPorts = %v, missing %s", cf.Config.ExposedPorts, port)
		}
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("config platform = %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.version":  o.version,
		"org.opencontainers.image.revision": o.revision,
		"org.opencontainers.image.source":   o.source,
		"org.opencontainers.image.created":  "2026-01-02T03:04:05Z",
	}
	for k, want := range wantLabels {
		if got := cf.Config.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
	if !cf.Created.Time.Equal(o.created) {
		t.Errorf("Created = %v, want %v", cf.Created.Time, o.created)
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
		t.Errorf("layer media type = %s, want %s", mt, types.OCILayer)
	}
	files := readLayer(t, img)
	bin, ok := files[strings.TrimPrefix(binaryPath, "/")]
	if !ok {
		t.Fatalf("the layer has no %s; it has %v", binaryPath, names(files))
	}
	if bin.hdr.Typeflag != tar.TypeReg || bin.hdr.Mode&0o111 != 0o111 || bin.hdr.Uid != 0 {
		t.Errorf("%s: type %c mode %o uid %d, want a regular file, executable by all, owned by root", binaryPath, bin.hdr.Typeflag, bin.hdr.Mode, bin.hdr.Uid)
	}
	if !bytes.HasPrefix(bin.body, []byte("\x7fELF")) {
		t.Errorf("%s is not an ELF binary", binaryPath)
	}
	link, ok := files[strings.TrimPrefix(erlBinary, "/")]
	if !ok || link.hdr.Typeflag != tar.TypeSymlink || link.hdr.Linkname != binaryPath {
		t.Errorf("%s = %+v, want a link to %s", erlBinary, link.hdr, binaryPath)
	}
	ca, ok := files[strings.TrimPrefix(caBundle, "/")]
	want, _ := os.ReadFile(o.caFile)
	if !ok || !bytes.Equal(ca.body, want) || !bytes.Contains(ca.body, []byte("BEGIN CERTIFICATE")) {
		t.Errorf("%s: present %v, %d bytes, want the %d bytes of %s", caBundle, ok, len(ca.body), len(want), o.caFile)
	}
	if pw := files["etc/passwd"]; !strings.Contains(string(pw.body), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd = %q, want the nonroot user 65532", pw.body)
	}
	for name, f := range files {
		if path.Base(name) == "sh" || path.Base(name) == "bash" || path.Base(name) == "busybox" {
			t.Errorf("the layer holds a shell, %s (%c)", name, f.hdr.Typeflag)
		}
		if !f.hdr.ModTime.Equal(o.created) {
			t.Errorf("%s mtime = %v, want the commit time %v", name, f.hdr.ModTime, o.created)
		}
	}

	// The binary, as taken out of the layer, runs.
	exe := filepath.Join(t.TempDir(), "limiter")
	if err := os.WriteFile(exe, bin.body, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, exe, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("limiter --help (from the layer) = %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "usage:") || !strings.Contains(string(out), "limiter") {
		t.Errorf("limiter --help (from the layer) printed %q, want its usage", out)
	}
	// Static: no interpreter to load it.
	if bytes.Contains(bin.body, []byte("/lib64/ld-linux")) || bytes.Contains(bin.body, []byte("/lib/ld-linux")) {
		t.Errorf("%s names a dynamic loader: it is not static", binaryPath)
	}

	// The tarball holds the same image.
	tb, err := tarball.ImageFromPath(res.tarballs["linux/"+runtime.GOARCH], nil)
	if err != nil {
		t.Fatalf("tarball.ImageFromPath = %v", err)
	}
	tbID, err := tb.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	imgID, _ := img.ConfigName()
	if tbID != imgID {
		t.Errorf("tarball config %s, layout config %s: want one image", tbID, imgID)
	}

	// A second build of the same commit gives the same index.
	o2 := o
	o2.out = t.TempDir()
	res2, err := build(ctx, o2)
	if err != nil {
		t.Fatalf("second build() = %v", err)
	}
	if res2.index != res.index {
		t.Errorf("two builds of one commit: index %s then %s, want the same digest", res.index, res2.index)
	}
}

// TestBuildErrors checks that a wrong setting is refused before anything is built,
// with a message that names the flag.
func TestBuildErrors(t *testing.T) {
	notPEM := filepath.Join(t.TempDir(), "empty.pem")
	if err := os.WriteFile(notPEM, []byte("nothing"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		edit func(*options)
		want string
	}{
		{"missing CA file", func(o *options) { o.caFile = "/nonexistent/ca.crt" }, "-ca-file"},
		{"CA file without a certificate", func(o *options) { o.caFile = notPEM }, "no PEM certificate"},
		{"version not a tag", func(o *options) { o.version = "v1 beta" }, "-version"},
		{"no platform", func(o *options) { o.platforms = nil }, "-platforms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testOptions(t)
			tt.edit(&o)
			_, err := build(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("build() = %v, want an error naming %q", err, tt.want)
			}
		})
	}
}

func TestParsePlatforms(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr string
	}{
		{"linux/amd64", "linux/amd64", ""},
		{"linux/amd64, linux/arm64", "linux/amd64,linux/arm64", ""},
		{"linux/arm/v7", "linux/arm/v7", ""},
		{"windows/amd64", "", "linux only"},
		{"linux/amd64,linux/amd64", "", "twice"},
		{"", "", "not a platform"},
	}
	for _, tt := range tests {
		got, err := parsePlatforms(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parsePlatforms(%q) = %v, %v, want an error with %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		var s []string
		for _, p := range got {
			s = append(s, p.String())
		}
		if err != nil || strings.Join(s, ",") != tt.want {
			t.Errorf("parsePlatforms(%q) = %v, %v, want %s", tt.in, s, err, tt.want)
		}
	}
}

// A file is one entry of the image's filesystem.
type file struct {
	hdr  tar.Header
	body []byte
}

// readLayer flattens img's layers into its filesystem.
func readLayer(t *testing.T, img v1.Image) map[string]file {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string]file{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading the layer: %v", err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")] = file{hdr: *h, body: b}
	}
	return files
}

func names(files map[string]file) []string {
	var out []string
	for n := range files {
		out = append(out, n)
	}
	return out
}

// FuzzParsePlatforms checks that any -platforms value is either refused or read into
// linux platforms that read back the same.
func FuzzParsePlatforms(f *testing.F) {
	for _, s := range []string{"linux/amd64", "linux/amd64,linux/arm64", "linux/arm/v7", "windows/amd64", "", ",", "linux", "linux/amd64/v2/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parsePlatforms(s)
		if err != nil {
			return
		}
		var back []string
		for _, p := range got {
			if p.OS != "linux" {
				t.Fatalf("parsePlatforms(%q) gave %s, want linux only", s, p.String())
			}
			back = append(back, p.String())
		}
		again, err := parsePlatforms(strings.Join(back, ","))
		if err != nil || len(again) != len(got) {
			t.Fatalf("parsePlatforms(%q) = %v, which reads back as %v, %v", s, back, again, err)
		}
		for i := range again {
			if again[i].String() != back[i] {
				t.Fatalf("parsePlatforms(%q): %s reads back as %s", s, back[i], again[i].String())
			}
		}
	})
}
