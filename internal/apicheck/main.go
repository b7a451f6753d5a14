// Command apicheck fails when the exported API of idem's library packages
// breaks compatibility with the last release's.
//
// The release is the tag named in testdata/api/BASE (v0.1.0, say). When
// the clone has that tag, the tag's tree is checked out in a temporary git
// worktree, both trees are type-checked and golang.org/x/exp/apidiff
// compares them. Without the tag (a shallow CI clone, an unreleased
// module), the tree is compared with the committed text baseline
// testdata/api/<tag>.txt: one line per exported name and its signature,
// the form of Go's api/go1.txt. A line of the baseline the tree no longer
// has is a removed or changed name; lines the tree adds pass.
//
// The library's packages are the main module's, less commands, internal/
// and examples/. With -write it records the tree's API as accepted: it
// rewrites testdata/api/<tag>.txt, and when the tag exists, lists apidiff's
// incompatible changes in testdata/api/<tag>.accepted, which later checks
// let pass. An intended break (a minor version of v0 may break, with a
// CHANGELOG entry) is accepted so, in the commit that makes it.
//
//	go run -C internal/apicheck . -root ../..          # make vet
//	go run -C internal/apicheck . -root ../.. -write   # make api-baseline
//
// The command is a module of its own: apidiff and go/packages stay out of
// the library's go.mod.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/exp/apidiff"
	"golang.org/x/tools/go/packages"
)

func main() {
	root := flag.String("root", ".", "the repository's root")
	write := flag.Bool("write", false, "record the tree's API as accepted (make api-baseline)")
	flag.Parse()
	if err := run(*root, *write); err != nil {
		fmt.Fprintln(os.Stderr, "apicheck:", err)
		os.Exit(1)
	}
}

func run(root string, write bool) error {
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	dir := filepath.Join(root, "testdata", "api")
	b, err := os.ReadFile(filepath.Join(dir, "BASE"))
	if err != nil {
		return fmt.Errorf("the release to compare with: %w", err)
	}
	tag := strings.TrimSpace(string(b))
	if tag == "" || strings.ContainsAny(tag, "/\\ \n") {
		return fmt.Errorf("testdata/api/BASE holds %q: want one tag, such as v0.1.0", tag)
	}
	baseline := filepath.Join(dir, tag+".txt")
	acceptedFile := filepath.Join(dir, tag+".accepted")

	cur, err := load(root)
	if err != nil {
		return err
	}
	tagged := hasTag(root, tag)
	if write {
		if err := writeLines(baseline, "API of the library's packages, accepted against "+tag+"; written by make api-baseline", api(cur)); err != nil {
			return err
		}
		fmt.Printf("apicheck: wrote %s\n", rel(root, baseline))
		if !tagged {
			return nil
		}
		breaks, err := againstTag(root, tag, cur)
		if err != nil {
			return err
		}
		if err := writeLines(acceptedFile, "apidiff's incompatible changes against "+tag+" accepted by make api-baseline (CHANGELOG.md says why)", breaks); err != nil {
			return err
		}
		fmt.Printf("apicheck: wrote %s (%d accepted)\n", rel(root, acceptedFile), len(breaks))
		return nil
	}

	var breaks []string
	var against string
	if tagged {
		against = "the tag " + tag + " (apidiff)"
		if breaks, err = againstTag(root, tag, cur); err != nil {
			return err
		}
		accepted, err := readLines(acceptedFile)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		breaks = slices.DeleteFunc(breaks, func(b string) bool { return slices.Contains(accepted, b) })
	} else {
		against = rel(root, baseline) + " (no tag " + tag + " in this clone)"
		base, err := readLines(baseline)
		if err != nil {
			return fmt.Errorf("no tag %s in this clone and no baseline: %w (make api-baseline writes it)", tag, err)
		}
		for _, l := range Removed(base, api(cur)) {
			breaks = append(breaks, "removed or changed: "+l)
		}
	}
	if len(breaks) == 0 {
		fmt.Printf("apicheck: API compatible with %s\n", against)
		return nil
	}
	var msg strings.Builder
	fmt.Fprintf(&msg, "%d incompatible change(s) against %s:\n", len(breaks), against)
	for _, b := range breaks {
		fmt.Fprintf(&msg, "\t%s\n", b)
	}
	msg.WriteString("A patch version never breaks; a minor version of v0 may, with a CHANGELOG entry: then make api-baseline accepts the change (docs/development.md).")
	return errors.New(msg.String())
}

// load type-checks the library's packages of the module at dir.
func load(dir string) ([]*packages.Package, error) {
	cfg := &packages.Config{Mode: packages.NeedName | packages.NeedTypes, Dir: dir}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	var out []*packages.Package
	for _, p := range pkgs {
		if len(p.Errors) > 0 {
			return nil, fmt.Errorf("load %s: %v", p.PkgPath, p.Errors[0])
		}
		if library(p) {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("load %s: no library packages", dir)
	}
	return out, nil
}

// library reports whether p is part of the API users import: not a
// command, not internal, not an example.
func library(p *packages.Package) bool {
	if p.Name == "main" {
		return false
	}
	for _, elem := range strings.Split(p.PkgPath, "/") {
		if elem == "internal" || elem == "examples" || elem == "testdata" {
			return false
		}
	}
	return true
}

// api is the text form of pkgs' exported API, sorted.
func api(pkgs []*packages.Package) []string {
	var out []string
	for _, p := range pkgs {
		out = append(out, Features(p.Types)...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// hasTag reports whether the clone at root has tag.
func hasTag(root, tag string) bool {
	return exec.Command("git", "-C", root, "rev-parse", "-q", "--verify", "refs/tags/"+tag+"^{commit}").Run() == nil
}

// againstTag lists apidiff's incompatible changes from tag's tree to cur.
func againstTag(root, tag string, cur []*packages.Package) ([]string, error) {
	tmp, err := os.MkdirTemp("", "apicheck-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	wt := filepath.Join(tmp, tag)
	if out, err := exec.Command("git", "-C", root, "worktree", "add", "--detach", wt, "refs/tags/"+tag).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("git worktree add %s: %v: %s", tag, err, out)
	}
	defer func() { _ = exec.Command("git", "-C", root, "worktree", "remove", "--force", wt).Run() }()
	old, err := load(wt)
	if err != nil {
		return nil, fmt.Errorf("the tree of %s: %w", tag, err)
	}
	r := apidiff.ModuleChanges(module(old), module(cur))
	var breaks []string
	for _, c := range r.Changes {
		if !c.Compatible {
			breaks = append(breaks, c.Message)
		}
	}
	slices.Sort(breaks)
	return breaks, nil
}

func module(pkgs []*packages.Package) *apidiff.Module {
	m := &apidiff.Module{}
	for _, p := range pkgs {
		if p.Module != nil {
			m.Path = p.Module.Path
		}
		m.Packages = append(m.Packages, p.Types)
	}
	if m.Path == "" {
		m.Path = modulePath(pkgs)
	}
	return m
}

// modulePath is the longest path prefix pkgs share, when go/packages did
// not say which module they are of.
func modulePath(pkgs []*packages.Package) string {
	prefix := pkgs[0].PkgPath
	for _, p := range pkgs[1:] {
		for !strings.HasPrefix(p.PkgPath+"/", prefix+"/") {
			i := strings.LastIndex(prefix, "/")
			if i < 0 {
				return ""
			}
			prefix = prefix[:i]
		}
	}
	return prefix
}

// Removed returns the lines of base that cur lacks: names removed or
// changed. Both are sorted.
func Removed(base, cur []string) []string {
	var out []string
	for _, l := range base {
		if _, found := slices.BinarySearch(cur, l); !found {
			out = append(out, l)
		}
	}
	return out
}

func readLines(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if l := sc.Text(); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out, sc.Err()
}

func writeLines(path, comment string, lines []string) error {
	var b strings.Builder
	b.WriteString("# " + comment + "\n")
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func rel(root, path string) string {
	if r, err := filepath.Rel(root, path); err == nil {
		return r
	}
	return path
}
