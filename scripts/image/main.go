// Command image builds the OCI image of tollgate's decision service without a
// container daemon or a registry: the static linux binary of ./lambda/limiter
// (CGO_ENABLED=0), for each platform asked for, on an empty base, written with
// go-containerregistry as an OCI image layout (an image index, one image per
// platform) and, per platform, as a tarball that `docker load` and
// `kind load image-archive` read.
//
// The image holds one layer:
//
//	/usr/bin/limiter                    the binary, the entrypoint
//	/bin/ratelimit -> /usr/bin/limiter  where envoyproxy/ratelimit's image keeps its binary,
//	                                    so a Deployment whose command is /bin/ratelimit runs it
//	/etc/ssl/certs/ca-certificates.crt  the CA bundle, copied from -ca-file (the build
//	                                    machine's), where Go's crypto/x509 looks on linux
//	/etc/passwd, /etc/group             root and nonroot (65532), the user the image runs as
//	/tmp                                sticky and world-writable, like any /tmp
//
// and no shell. Labels follow the OCI annotation keys: version (git describe),
// revision (the commit), source, created (the commit's time, so two builds of one
// commit give the same digests).
//
//	go -C scripts run ./image -out dist/image -platforms linux/amd64,linux/arm64
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/tollgate-dev/tollgate/scripts/internal/repo"
)

// The image's fixed facts, which the Helm chart under deploy/helm/tollgate relies on.
const (
	binaryPath  = "/usr/bin/limiter"
	erlBinary   = "/bin/ratelimit"
	caBundle    = "/etc/ssl/certs/ca-certificates.crt"
	nonrootUID  = 65532
	imageUser   = "65532:65532"
	imageName   = "tollgate"
	defaultRepo = "https://github.com/tollgate-dev/tollgate"
)

// exposedPorts are the service's default ports, as envoyproxy/ratelimit numbers
// them: HTTP (PORT), gRPC (GRPC_PORT) and debug (DEBUG_PORT).
var exposedPorts = []string{"8080/tcp", "8081/tcp", "6070/tcp"}

// options says what to build and where.
type options struct {
	root      string        // the repository's root, holding ./lambda/limiter
	out       string        // the output directory: out/oci (the layout) and out/*.tar
	platforms []v1.Platform // linux only
	caFile    string        // the CA bundle copied into the image
	version   string        // org.opencontainers.image.version, and the layout's tag
	revision  string        // org.opencontainers.image.revision
	source    string        // org.opencontainers.image.source
	created   time.Time     // org.opencontainers.image.created, and every file's mtime
}

// result is what build wrote.
type result struct {
	layout   string            // the OCI image layout's directory
	tarballs map[string]string // platform ("linux/amd64") -> docker-loadable tarball
	index    v1.Hash           // the image index's digest
}

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	out := fs.String("out", "dist/image", "output directory, relative to the repository's root: the OCI layout goes to OUT/oci, one tarball per platform to OUT")
	plats := fs.String("platforms", "linux/"+runtime.GOARCH, "comma-separated linux platforms to build, e.g. linux/amd64,linux/arm64")
	caFile := fs.String("ca-file", "/etc/ssl/certs/ca-certificates.crt", "PEM bundle of CA certificates copied into the image")
	version := fs.String("version", "", "image version label and tag; empty: git describe --tags --always --dirty")
	source := fs.String("source", defaultRepo, "image source label")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: every setting is a flag (-h lists them)", fs.Arg(0))
	}
	if err := repo.Chdir(); err != nil {
		return err
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	platforms, err := parsePlatforms(*plats)
	if err != nil {
		return err
	}
	opts := options{root: root, out: *out, platforms: platforms, caFile: *caFile, version: *version, source: *source}
	if err := opts.fromGit(ctx); err != nil {
		return err
	}
	res, err := build(ctx, opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "image %s:%s (index %s)\n  OCI layout: %s\n", imageName, opts.version, res.index, res.layout)
	for _, p := range platforms {
		fmt.Fprintf(stdout, "  %s tarball: %s\n", p.String(), res.tarballs[p.String()])
	}
	return nil
}

// parsePlatforms reads "linux/amd64,linux/arm64".
func parsePlatforms(s string) ([]v1.Platform, error) {
	var out []v1.Platform
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		p, err := v1.ParsePlatform(f)
		if err != nil || f == "" {
			return nil, fmt.Errorf("-platforms: %q is not a platform: write os/arch, e.g. linux/amd64", f)
		}
		if p.OS != "linux" {
			return nil, fmt.Errorf("-platforms: %q: the image is linux only (write linux/%s)", f, p.Architecture)
		}
		if seen[p.String()] {
			return nil, fmt.Errorf("-platforms: %q is listed twice", f)
		}
		seen[p.String()] = true
		out = append(out, *p)
	}
	return out, nil
}

// fromGit fills the labels that were not given from the repository's git history:
// the version from git describe, the revision and the creation time from HEAD.
// Outside a git checkout the version is "dev" and the time the Unix epoch.
func (o *options) fromGit(ctx context.Context) error {
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = o.root
		b, err := cmd.Output()
		return strings.TrimSpace(string(b)), err
	}
	if o.version == "" {
		v, err := git("describe", "--tags", "--always", "--dirty")
		if err != nil || v == "" {
			v = "dev"
		}
		o.version = v
	}
	if o.revision == "" {
		if rev, err := git("rev-parse", "HEAD"); err == nil {
			o.revision = rev
		}
	}
	if o.created.IsZero() {
		o.created = time.Unix(0, 0).UTC()
		if ct, err := git("log", "-1", "--format=%ct"); err == nil {
			if sec, err := strconv.ParseInt(ct, 10, 64); err == nil {
				o.created = time.Unix(sec, 0).UTC()
			}
		}
	}
	return nil
}

// build compiles the binary for every platform, assembles the images and writes
// the layout and the tarballs.
func build(ctx context.Context, o options) (result, error) {
	if len(o.platforms) == 0 {
		return result{}, errors.New("no platform to build: give -platforms linux/amd64")
	}
	tag, err := name.NewTag(imageName+":"+o.version, name.WeakValidation)
	if err != nil {
		return result{}, fmt.Errorf("-version %q cannot be an image tag (letters, digits, '.', '_', '-'; at most 128): %w", o.version, err)
	}
	ca, err := os.ReadFile(o.caFile)
	if err != nil {
		return result{}, fmt.Errorf("-ca-file: %w (give the build machine's PEM bundle, e.g. /etc/ssl/certs/ca-certificates.crt)", err)
	}
	if !bytes.Contains(ca, []byte("-----BEGIN CERTIFICATE-----")) {
		return result{}, fmt.Errorf("-ca-file %s holds no PEM certificate", o.caFile)
	}
	out := o.out
	if !filepath.IsAbs(out) {
		out = filepath.Join(o.root, out)
	}
	work, err := os.MkdirTemp("", "tollgate-image-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(work)

	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	res := result{layout: filepath.Join(out, "oci"), tarballs: map[string]string{}}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return result{}, err
	}
	for _, p := range o.platforms {
		bin := filepath.Join(work, "limiter-"+p.Architecture+p.Variant)
		if err := compile(ctx, o.root, p, bin); err != nil {
			return result{}, err
		}
		img, err := assemble(o, p, bin, ca)
		if err != nil {
			return result{}, fmt.Errorf("%s: %w", p.String(), err)
		}
		tb := filepath.Join(out, fmt.Sprintf("%s-%s-%s%s.tar", imageName, p.OS, p.Architecture, p.Variant))
		if err := tarball.WriteToFile(tb, tag, img); err != nil {
			return result{}, fmt.Errorf("write %s: %w", tb, err)
		}
		res.tarballs[p.String()] = tb
		plat := p
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &plat}})
	}
	idx = mutate.Annotations(idx, labels(o)).(v1.ImageIndex)
	if err := os.RemoveAll(res.layout); err != nil {
		return result{}, err
	}
	lp, err := layout.Write(res.layout, empty.Index)
	if err != nil {
		return result{}, fmt.Errorf("write the OCI layout %s: %w", res.layout, err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": o.version,
	})); err != nil {
		return result{}, fmt.Errorf("write the OCI layout %s: %w", res.layout, err)
	}
	if res.index, err = idx.Digest(); err != nil {
		return result{}, err
	}
	return res, nil
}

// compile builds ./lambda/limiter as a static linux binary for p.
func compile(ctx context.Context, root string, p v1.Platform, bin string) error {
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	cmd := exec.CommandContext(ctx, goTool, "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", bin, "./lambda/limiter")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+p.Architecture)
	if p.Architecture == "arm" && p.Variant != "" {
		cmd.Env = append(cmd.Env, "GOARM="+strings.TrimPrefix(p.Variant, "v"))
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./lambda/limiter for %s: %w\n%s", p.String(), err, b)
	}
	return nil
}

// labels are the image's OCI labels (and the index's annotations).
func labels(o options) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":       imageName,
		"org.opencontainers.image.description": "tollgate's decision service: Envoy's gRPC rate limit service and HTTP decisions, on Redis",
		"org.opencontainers.image.version":     o.version,
		"org.opencontainers.image.source":      o.source,
		"org.opencontainers.image.created":     o.created.Format(time.RFC3339),
	}
	if o.revision != "" {
		l["org.opencontainers.image.revision"] = o.revision
	}
	return l
}

// assemble makes the image of one platform from its binary.
func assemble(o options, p v1.Platform, bin string, ca []byte) (v1.Image, error) {
	exe, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	layerTar, err := rootfs(o.created, exe, ca)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Author:    "tollgate scripts/image",
			Created:   v1.Time{Time: o.created},
			CreatedBy: "go build ./lambda/limiter (CGO_ENABLED=0, GOOS=linux, GOARCH=" + p.Architecture + ")",
			Comment:   "the binary, the CA bundle, /etc/passwd; no shell",
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Created = v1.Time{Time: o.created}
	cf.Author = "tollgate"
	cf.Config = v1.Config{
		Entrypoint:   []string{binaryPath},
		User:         imageUser,
		WorkingDir:   "/",
		Env:          []string{"PATH=/usr/bin:/bin", "SSL_CERT_FILE=" + caBundle},
		ExposedPorts: map[string]struct{}{},
		Labels:       labels(o),
	}
	for _, port := range exposedPorts {
		cf.Config.ExposedPorts[port] = struct{}{}
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, labels(o)).(v1.Image), nil
}

// rootfs is the layer's tar: directories, the binary, its ERL-named link, the CA
// bundle and the user database, each with mtime t.
func rootfs(t time.Time, exe, ca []byte) ([]byte, error) {
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonrootUID, nonrootUID)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", nonrootUID)
	entries := []struct {
		hdr  tar.Header
		body []byte
	}{
		{hdr: tar.Header{Name: "bin/", Mode: 0o755, Typeflag: tar.TypeDir}},
		{hdr: tar.Header{Name: "etc/", Mode: 0o755, Typeflag: tar.TypeDir}},
		{hdr: tar.Header{Name: "etc/group", Mode: 0o644, Typeflag: tar.TypeReg}, body: []byte(group)},
		{hdr: tar.Header{Name: "etc/passwd", Mode: 0o644, Typeflag: tar.TypeReg}, body: []byte(passwd)},
		{hdr: tar.Header{Name: "etc/ssl/", Mode: 0o755, Typeflag: tar.TypeDir}},
		{hdr: tar.Header{Name: "etc/ssl/certs/", Mode: 0o755, Typeflag: tar.TypeDir}},
		{hdr: tar.Header{Name: strings.TrimPrefix(caBundle, "/"), Mode: 0o644, Typeflag: tar.TypeReg}, body: ca},
		{hdr: tar.Header{Name: "home/", Mode: 0o755, Typeflag: tar.TypeDir}},
		{hdr: tar.Header{Name: "home/nonroot/", Mode: 0o700, Typeflag: tar.TypeDir, Uid: nonrootUID, Gid: nonrootUID}},
		{hdr: tar.Header{Name: "tmp/", Mode: 0o1777, Typeflag: tar.TypeDir}},
		{hdr: tar.Header{Name: "usr/", Mode: 0o755, Typeflag: tar.TypeDir}},
		{hdr: tar.Header{Name: "usr/bin/", Mode: 0o755, Typeflag: tar.TypeDir}},
		{hdr: tar.Header{Name: strings.TrimPrefix(binaryPath, "/"), Mode: 0o755, Typeflag: tar.TypeReg}, body: exe},
		{hdr: tar.Header{Name: strings.TrimPrefix(erlBinary, "/"), Mode: 0o777, Typeflag: tar.TypeSymlink, Linkname: binaryPath}},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		h.ModTime = t
		h.Format = tar.FormatPAX
		h.Size = int64(len(e.body))
		if err := tw.WriteHeader(&h); err != nil {
			return nil, fmt.Errorf("layer %s: %w", h.Name, err)
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, fmt.Errorf("layer %s: %w", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
