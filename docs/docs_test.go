// Package docs_test checks that the user documentation, README.md and the Markdown pages
// under docs/, agrees with the repository it describes:
//
//   - every `make TARGET` named in code (a fenced block or an inline code span) is a
//     target of the Makefile;
//   - every flag given to the decision service (lambda/limiter) or the authorizer
//     (lambda/authorizer) exists in that binary's flag set, read from the built binary's
//     --help;
//   - they carry no issue references and no bare commit ids: they say what the product
//     does, not which ticket or commit made it;
//   - every relative link resolves to a file, and an anchor into a Markdown file to one
//     of its headings.
//
// The reports kept under docs/bench/ and docs/soak/ come from `make bench`,
// `make bench-erl` and `make soak`; a report copied there is checked like any page.
package docs_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
)

// A doc is one Markdown file, split into prose lines and logical code lines.
type doc struct {
	path  string   // relative to the repository root, with slashes
	lines []string // every line, lines[0] being line 1
	prose []line   // lines outside fenced code blocks
	code  []line   // lines inside fenced code blocks, continuation lines joined
}

// A line is a line of a doc with its 1-based number, for messages.
type line struct {
	n    int
	text string
}

func (d doc) at(l line) string { return fmt.Sprintf("%s:%d", d.path, l.n) }

// repoRoot finds the module root: the nearest directory above the test's with a go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("Getwd() = %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// readDocs reads README.md and every .md file under docs/.
func readDocs(t *testing.T, root string) []doc {
	t.Helper()
	paths := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !e.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			paths = append(paths, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking docs/: %v", err)
	}
	var docs []doc
	for _, p := range paths {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(p)))
		if err != nil {
			t.Fatalf("ReadFile(%s) = %v", p, err)
		}
		docs = append(docs, parseDoc(p, string(b)))
	}
	return docs
}

// parseDoc splits text into prose and code lines. In code, a line that ends with a
// backslash continues on the next one, as in a shell.
func parseDoc(path, text string) doc {
	d := doc{path: path, lines: strings.Split(text, "\n")}
	inFence := false
	var pending *line
	for i, s := range d.lines {
		trimmed := strings.TrimSpace(s)
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			inFence = !inFence
			pending = nil
			continue
		}
		if !inFence {
			d.prose = append(d.prose, line{i + 1, s})
			continue
		}
		if pending != nil {
			pending.text += " " + s
		} else {
			d.code = append(d.code, line{i + 1, s})
			pending = &d.code[len(d.code)-1]
		}
		if strings.HasSuffix(trimmed, `\`) {
			pending.text = strings.TrimSuffix(strings.TrimRight(pending.text, " \t"), `\`)
		} else {
			pending = nil
		}
	}
	return d
}

// paragraphs returns d's prose as paragraphs: runs of lines between blank lines,
// headings and code blocks, joined with newlines, each numbered by its first line. An
// inline code span or a link may wrap from one line of a paragraph to the next.
func (d doc) paragraphs() []line {
	var out []line
	prev := -1
	for _, l := range d.prose {
		blank := strings.TrimSpace(l.text) == ""
		switch {
		case blank:
			prev = -1
			continue
		case heading.MatchString(l.text):
			out = append(out, l)
			prev = -1
			continue
		case prev == l.n-1 && len(out) > 0:
			out[len(out)-1].text += "\n" + l.text
		default:
			out = append(out, l)
		}
		prev = l.n
	}
	return out
}

// find returns the matches of re's group in p, each with the line it starts on and its
// line breaks turned into spaces.
func find(p line, re *regexp.Regexp, group int) []line {
	var out []line
	for _, m := range re.FindAllStringSubmatchIndex(p.text, -1) {
		start, end := m[2*group], m[2*group+1]
		n := p.n + strings.Count(p.text[:start], "\n")
		out = append(out, line{n, strings.ReplaceAll(p.text[start:end], "\n", " ")})
	}
	return out
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

// spans returns the inline code spans of d, each with the line it starts on.
func (d doc) spans() []line {
	var out []line
	for _, p := range d.paragraphs() {
		out = append(out, find(p, codeSpan, 1)...)
	}
	return out
}

// commands returns the code a doc runs or names: its code lines with shell comments
// cut off, and its inline code spans, each with the line it is on.
func (d doc) commands() []line {
	var out []line
	for _, l := range d.code {
		s := l.text
		if strings.HasPrefix(strings.TrimSpace(s), "#") {
			continue
		}
		if i := strings.Index(s, " #"); i >= 0 {
			s = s[:i]
		}
		out = append(out, line{l.n, s})
	}
	return append(out, d.spans()...)
}

// makeTargets returns the targets of the Makefile at root.
func makeTargets(t *testing.T, root string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatalf("ReadFile(Makefile) = %v", err)
	}
	rule := regexp.MustCompile(`^([A-Za-z0-9_./%-]+(?:[ \t]+[A-Za-z0-9_./%-]+)*)[ \t]*:([^=]|$)`)
	targets := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		m := rule.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		for _, name := range strings.Fields(m[1]) {
			if !strings.HasPrefix(name, ".") {
				targets[name] = true
			}
		}
	}
	if len(targets) == 0 {
		t.Fatal("the Makefile has no targets: the rule pattern no longer reads it")
	}
	return targets
}

// namedTargets returns the targets a command names after each `make`: every word that
// is neither an assignment (VAR=value) nor an option, up to the end of the command.
func namedTargets(cmd string) []string {
	var out []string
	words := strings.Fields(cmd)
	for i, w := range words {
		if w != "make" {
			continue
		}
		for _, a := range words[i+1:] {
			if a == "&&" || a == "||" || a == ";" || a == "|" || a == "/" {
				break
			}
			a = strings.TrimRight(a, ".,;:)'")
			if a == "" || strings.HasPrefix(a, "-") || strings.Contains(a, "=") {
				continue
			}
			if !regexp.MustCompile(`^[A-Za-z0-9_.-]+$`).MatchString(a) {
				break
			}
			out = append(out, a)
		}
	}
	return out
}

func TestMakeTargetsExist(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	targets := makeTargets(t, root)
	for _, d := range readDocs(t, root) {
		for _, c := range d.commands() {
			for _, name := range namedTargets(c.text) {
				if !targets[name] {
					t.Errorf("%s: `make %s`: the Makefile has no target %q", d.at(c), name, name)
				}
			}
		}
	}
}

// A binary is a main package whose flags the docs may name.
type binary struct {
	name string     // as the docs' commands call it
	pkg  string     // its package, relative to the root
	help [][]string // argument lists that print its flags, e.g. {"--help"}
	// calls matches a command that runs it; the flags after the match are its.
	calls *regexp.Regexp
}

var binaries = []binary{
	{
		name:  "limiter",
		pkg:   "./lambda/limiter",
		help:  [][]string{{"--help"}, {"policy", "explain", "--help"}},
		calls: regexp.MustCompile(`(?:\./)?(?:lambda/limiter|dist/limiter(?:-local)?)\b`),
	},
	{
		name:  "authorizer",
		pkg:   "./lambda/authorizer",
		help:  [][]string{{"--help"}},
		calls: regexp.MustCompile(`(?:\./)?(?:lambda/authorizer|dist/authorizer)\b`),
	},
}

var usageFlag = regexp.MustCompile(`^\s+--?([A-Za-z0-9][A-Za-z0-9_.-]*)`)

// flagSet builds b and returns the flags its help output lists, with help and h, which
// Go's flag package always accepts.
func flagSet(t *testing.T, root, dir string, b binary) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	exe := filepath.Join(dir, b.name)
	build := exec.CommandContext(ctx, "go", "build", "-o", exe, b.pkg)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
	}
	flags := map[string]bool{"help": true, "h": true}
	for _, args := range b.help {
		run, cancel := context.WithTimeout(ctx, 30*time.Second)
		cmd := exec.CommandContext(run, exe, args...)
		cmd.Dir = dir
		// A clean environment: the help must not depend on the caller's variables, and
		// a binary that ignores --help must stop at once (no policy beside it, no
		// Lambda runtime, no Redis).
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "TOLLGATE_POLICY=" + filepath.Join(dir, "no-such-policy.yaml")}
		out, _ := cmd.CombinedOutput() // --help may exit 0, 1 or 2; the listing is what counts
		cancel()
		for _, l := range strings.Split(string(out), "\n") {
			if m := usageFlag.FindStringSubmatch(l); m != nil {
				flags[m[1]] = true
			}
		}
	}
	return flags
}

var docFlag = regexp.MustCompile(`^--?([a-z][a-z0-9-]*)(?:=.*)?$`)

func TestFlagsExist(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	dir := t.TempDir()
	sets := map[string]map[string]bool{}
	for _, b := range binaries {
		sets[b.name] = flagSet(t, root, dir, b)
	}
	if !sets["limiter"]["listen"] {
		t.Fatalf("the limiter's --help lists %v, without listen: the usage format changed", sets["limiter"])
	}
	for _, d := range readDocs(t, root) {
		// A command that runs a binary, in a code block or an inline span: the flags after
		// its name are that binary's.
		for _, c := range d.commands() {
			for _, b := range binaries {
				loc := b.calls.FindStringIndex(c.text)
				if loc == nil {
					continue
				}
				for _, w := range strings.Fields(c.text[loc[1]:]) {
					m := docFlag.FindStringSubmatch(w)
					if m != nil && !sets[b.name][m[1]] {
						t.Errorf("%s: %s is given %s, which is not in its flag set (%s)", d.at(c), b.name, w, keys(sets[b.name]))
					}
				}
			}
		}
		// Prose names a flag as an inline code span that starts with it (`--policy-poll`,
		// `--grpc-listen ADDR`): the decision service's, unless the line speaks only of
		// the authorizer. Another program's flag is written with its command
		// (`redis-cli --cluster create`), so it does not start a span.
		for _, sp := range d.spans() {
			if !strings.HasPrefix(sp.text, "--") {
				continue
			}
			owner := "limiter"
			lower := strings.ToLower(d.lines[sp.n-1])
			if strings.Contains(lower, "authorizer") && !strings.Contains(lower, "limiter") && !strings.Contains(lower, "decision service") {
				owner = "authorizer"
			}
			m := docFlag.FindStringSubmatch(strings.Fields(sp.text)[0])
			if m != nil && !sets[owner][m[1]] {
				t.Errorf("%s: `%s`: the %s has no flag --%s (its flags: %s)", d.at(sp), sp.text, owner, m[1], keys(sets[owner]))
			}
		}
	}
}

func keys(m map[string]bool) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return strings.Join(ks, ", ")
}

var (
	issueWord = regexp.MustCompile(`(?i)\b(?:issue|issues|pr|pull request|ticket)\s+#?\d+`)
	hashRef   = regexp.MustCompile(`#\d+\b`)
	url       = regexp.MustCompile(`[a-z][a-z0-9+.-]*://[^\s)>\]]+`)
	ownRepo   = regexp.MustCompile(`(?i)tollgate-dev/tollgate/(?:issues|pull|commit)/`)
	hexRun    = regexp.MustCompile(`[0-9a-fA-F]+`)
	hasLetter = regexp.MustCompile(`[a-f]`)
	hasDigit  = regexp.MustCompile(`[0-9]`)
)

// commitIDs returns where s has bare commit ids: runs of 7 to 40 lower-case hex digits,
// with a letter and a digit, standing as words of their own. A run inside a larger
// token (a Redis key's `.a1b2c3d4`, a `sha256:` value, a pseudo-version's suffix) is
// not a commit id.
func commitIDs(s string) [][]int {
	var out [][]int
	for _, loc := range hexRun.FindAllStringIndex(s, -1) {
		run := s[loc[0]:loc[1]]
		if len(run) < 7 || len(run) > 40 || run != strings.ToLower(run) || !hasLetter.MatchString(run) || !hasDigit.MatchString(run) {
			continue
		}
		if loc[0] > 0 {
			if p := rune(s[loc[0]-1]); isWordRune(p) || strings.ContainsRune(".:/-_{=#~+@", p) {
				continue
			}
		}
		if loc[1] < len(s) {
			if n := rune(s[loc[1]]); isWordRune(n) || strings.ContainsRune("-_/:@", n) {
				continue
			}
		}
		out = append(out, loc)
	}
	return out
}

func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }

func TestNoInternalReferences(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	for _, d := range readDocs(t, root) {
		for _, l := range append(d.paragraphs(), d.code...) {
			at := func(off int) string { return d.at(line{l.n + strings.Count(l.text[:off], "\n"), ""}) }
			urls := url.FindAllStringIndex(l.text, -1)
			inURL := func(i int) bool {
				for _, u := range urls {
					if i >= u[0] && i < u[1] {
						return true
					}
				}
				return false
			}
			for _, m := range issueWord.FindAllStringIndex(l.text, -1) {
				if !inURL(m[0]) {
					t.Errorf("%s: %q refers to an issue; say what the product does and why instead", at(m[0]), l.text[m[0]:m[1]])
				}
			}
			for _, m := range hashRef.FindAllStringIndex(l.text, -1) {
				if !inURL(m[0]) {
					t.Errorf("%s: %q looks like an issue reference; link an external project's issue by its URL", at(m[0]), l.text[m[0]:m[1]])
				}
			}
			for _, u := range urls {
				if ownRepo.MatchString(l.text[u[0]:u[1]]) {
					t.Errorf("%s: %s links tollgate's own issue, pull request or commit", at(u[0]), l.text[u[0]:u[1]])
				}
			}
			for _, id := range commitIDs(l.text) {
				t.Errorf("%s: %q looks like a bare commit id; describe the version instead", at(id[0]), l.text[id[0]:id[1]])
			}
		}
	}
}

var (
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	refLink    = regexp.MustCompile(`(?m)^\s*\[[^\]]+\]:\s+(\S+)`)
	scheme     = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	heading    = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
)

// slug is GitHub's anchor for a heading: lower case, punctuation dropped, spaces as
// hyphens.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// anchors returns the anchors of the Markdown file at path.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("ReadFile(%s) = %v", path, err)
	}
	d := parseDoc(path, string(b))
	seen := map[string]int{}
	out := map[string]bool{}
	for _, l := range d.prose {
		for _, m := range htmlAnchor.FindAllStringSubmatch(l.text, -1) {
			out[m[1]] = true
		}
		m := heading.FindStringSubmatch(l.text)
		if m == nil {
			continue
		}
		s := slug(m[2])
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func TestRelativeLinksResolve(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	for _, d := range readDocs(t, root) {
		for _, p := range d.paragraphs() {
			// Code spans are not links; blanking them keeps the line breaks where they were.
			p.text = codeSpan.ReplaceAllStringFunc(p.text, func(s string) string {
				return strings.Map(func(r rune) rune {
					if r == '\n' {
						return r
					}
					return ' '
				}, s)
			})
			for _, l := range append(find(p, inlineLink, 1), find(p, refLink, 1)...) {
				target := strings.Trim(l.text, "<>")
				if scheme.MatchString(target) {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				path := filepath.Join(root, filepath.FromSlash(d.path))
				if file != "" {
					path = filepath.Join(filepath.Dir(path), filepath.FromSlash(file))
				}
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: link %q: %v", d.at(l), target, err)
					continue
				}
				if anchor != "" && strings.HasSuffix(path, ".md") && !anchors(t, path)[anchor] {
					t.Errorf("%s: link %q: no heading in %s has the anchor #%s", d.at(l), target, filepath.Base(path), anchor)
				}
			}
		}
	}
}
