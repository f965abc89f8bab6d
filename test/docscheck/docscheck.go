// Package docscheck checks the project's Markdown (README.md and docs/)
// against the repository, so that the documentation cannot drift from it
// unnoticed:
//
//   - every relative link resolves to a file or directory, and every
//     #anchor to a heading (GitHub's slugs, see Slug) of the page it names;
//   - every `make TARGET` in a code span or a shell code block is a target
//     of the Makefile;
//   - every flag given to rdma-device-plugin (its subcommands discover,
//     doctor, serve), rdma-device-plugin-dra or the sriov CNI, in a code
//     span or a code block line, is one its --help lists (see FlagUses
//     for how a command line is recognised), and so is a code span that
//     is a flag alone on a page with a flags marker (see flagsMarkerRE);
//   - every ```json and ```yaml block parses (YAML: every document of a
//     multi-document block, duplicate keys refused), and a JSON block that
//     is a pool config (a top-level configList or resourceList) loads with
//     pool.Load.
//
// A block that is partial or wrong on purpose is exempted by SkipMarker on
// the line before it.
package docscheck

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// Problem is one thing the docs get wrong.
type Problem struct {
	File string
	Line int
	Msg  string
}

func (p Problem) String() string { return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg) }

// Known is what the docs are checked against.
type Known struct {
	MakeTargets map[string]bool
	// Flags by command: "rdma-device-plugin", "rdma-device-plugin doctor",
	// "rdma-device-plugin-dra", "sriov", … (see Commands), each the set
	// of flag names (without dashes) its --help lists.
	Flags map[string]map[string]bool
}

// Check checks files (slash-separated paths in fsys) and returns what is
// wrong, in file order.
func Check(fsys fs.FS, files []string, k Known) []Problem {
	c := &checker{fsys: fsys, known: k, docs: map[string]*doc{}}
	var out []Problem
	for _, f := range files {
		d, err := c.doc(f)
		if err != nil {
			out = append(out, Problem{f, 0, err.Error()})
			continue
		}
		out = append(out, d.problems...)
		out = append(out, c.links(f, d)...)
		out = append(out, c.code(f, d)...)
	}
	return out
}

type checker struct {
	fsys  fs.FS
	known Known
	docs  map[string]*doc // parsed pages, by path
}

func (c *checker) doc(file string) (*doc, error) {
	if d, ok := c.docs[file]; ok {
		return d, nil
	}
	b, err := fs.ReadFile(c.fsys, file)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	d := parse(file, string(b))
	c.docs[file] = d
	return d, nil
}

var (
	schemeRE    = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	lineAnchorR = regexp.MustCompile(`^L\d+(-L\d+)?$`)
)

// links checks every relative link of d (in file) and its anchor.
func (c *checker) links(file string, d *doc) []Problem {
	var out []Problem
	for _, l := range d.links {
		if schemeRE.MatchString(l.target) {
			continue // http:, https:, mailto:
		}
		target, anchor, _ := strings.Cut(l.target, "#")
		resolved := file
		if target != "" {
			resolved = path.Join(path.Dir(file), target)
			if !fs.ValidPath(resolved) {
				out = append(out, Problem{file, l.line, fmt.Sprintf("link %q leaves the repository", l.target)})
				continue
			}
			if _, err := fs.Stat(c.fsys, resolved); err != nil {
				out = append(out, Problem{file, l.line, fmt.Sprintf("link %q: no such file or directory %s", l.target, resolved)})
				continue
			}
		}
		if anchor == "" {
			continue
		}
		if !strings.HasSuffix(resolved, ".md") {
			if !lineAnchorR.MatchString(anchor) {
				out = append(out, Problem{file, l.line, fmt.Sprintf("link %q: an anchor on %s, which is not Markdown", l.target, resolved)})
			}
			continue
		}
		td, err := c.doc(resolved)
		if err != nil {
			out = append(out, Problem{file, l.line, fmt.Sprintf("link %q: %v", l.target, err)})
			continue
		}
		if !td.anchors[anchor] {
			out = append(out, Problem{file, l.line, fmt.Sprintf("link %q: %s has no heading with anchor #%s", l.target, resolved, anchor)})
		}
	}
	return out
}

// shellLangs are the code blocks whose lines are command lines; a block
// without a language is read too (usage synopses), never json, yaml or
// mermaid.
var shellLangs = map[string]bool{"": true, "sh": true, "bash": true, "shell": true, "console": true}

// code checks d's code spans and blocks: make targets, flags, and that
// JSON and YAML examples parse.
func (c *checker) code(file string, d *doc) []Problem {
	var out []Problem
	for _, cmd := range d.flagScope {
		if _, ok := c.known.Flags[cmd]; !ok {
			out = append(out, Problem{file, d.marker, fmt.Sprintf("flags marker: %q is not a command whose --help is known", cmd)})
		}
	}
	for _, s := range d.spans {
		out = append(out, c.commandLine(file, s.line, s.text, d.flagScope)...)
	}
	for _, b := range d.blocks {
		if b.skip {
			continue
		}
		switch {
		case b.lang == "json":
			if err := checkJSON(strings.Join(b.text, "\n")); err != nil {
				out = append(out, Problem{file, b.line, "json block: " + err.Error()})
			}
		case b.lang == "yaml" || b.lang == "yml":
			if err := checkYAML(strings.Join(b.text, "\n")); err != nil {
				out = append(out, Problem{file, b.line, "yaml block: " + err.Error()})
			}
		case shellLangs[b.lang]:
			for _, cl := range commandLines(b.text) {
				out = append(out, c.commandLine(file, b.line+cl.line, cl.text, nil)...)
			}
		}
	}
	return out
}

// commandLine checks the make targets and flags one command line names;
// scope is the page's flags marker for a code span that is a lone --flag
// (nil: not checked, and nil for code block lines).
func (c *checker) commandLine(file string, line int, text string, scope []string) []Problem {
	var out []Problem
	for _, t := range MakeTargets(text) {
		if !c.known.MakeTargets[t] {
			out = append(out, Problem{file, line, fmt.Sprintf("make %s: no such target in the Makefile", t)})
		}
	}
	for _, u := range FlagUses(text, scope != nil) {
		if u.Command == "" {
			if !c.inScope(scope, u.Flag) {
				out = append(out, Problem{file, line, fmt.Sprintf("--%s: no such flag of %s (the page's flags marker)", u.Flag, strings.Join(scope, ", "))})
			}
			continue
		}
		flags, ok := c.known.Flags[u.Command]
		if !ok {
			out = append(out, Problem{file, line, fmt.Sprintf("%s: no --help output known for this command", u.Command)})
			continue
		}
		if !flags[u.Flag] {
			out = append(out, Problem{file, line, fmt.Sprintf("%s --%s: no such flag in its --help", u.Command, u.Flag)})
		}
	}
	return out
}

func (c *checker) inScope(scope []string, flag string) bool {
	for _, cmd := range scope {
		if c.known.Flags[cmd][flag] {
			return true
		}
	}
	return false
}

// checkJSON parses one JSON value and, when it is a pool config, loads it.
func checkJSON(text string) error {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("more than one JSON value")
	}
	obj, ok := v.(map[string]any)
	if !ok || !isPoolConfig(obj) {
		return nil
	}
	dir, err := os.MkdirTemp("", "docscheck-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p := filepath.Join(dir, "config.json")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		return err
	}
	if _, err := pool.Load(p); err != nil {
		return fmt.Errorf("a pool config that does not load: %w", err)
	}
	return nil
}

// isPoolConfig: a pool config has a configList or resourceList at the top
// (keys match case-insensitively, as pool.Parse reads them).
func isPoolConfig(obj map[string]any) bool {
	for k := range obj {
		if strings.EqualFold(k, "configList") || strings.EqualFold(k, "resourceList") {
			return true
		}
	}
	return false
}

// checkYAML parses every document of a YAML stream, refusing duplicate
// keys.
func checkYAML(text string) error {
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(text)))
	for n := 1; ; n++ {
		b, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("document %d: %w", n, err)
		}
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		if _, err := yaml.YAMLToJSONStrict(b); err != nil {
			return fmt.Errorf("document %d: %w", n, err)
		}
	}
}
