package testenv

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The floors of docs/STYLE: dedup is the bottom of the library; the engine,
// the source and outbox drivers, the HTTP middleware, observability, the
// examples and the commands stand on it.
var aboveDedup = []string{"consumer", "adapters", "outbox", "httpidem", "observe", "examples", "cmd"}

// faultSuite tests the payments consumer of examples/payments: the one
// package outside examples/ whose tests may import an example.
const faultSuite = "internal/testenv/faults"

// TestInternalFloors fails when a package stands on the wrong floor:
//   - a helper in internal/ (outside internal/testenv, whose harnesses may
//     use anything) depends on a package above dedup;
//   - a package under dedup/ depends on httpidem or net/http;
//   - the tests of a package outside examples/ import an example.
//
// Dependencies are transitive (go list's Deps) and count the package's own
// files, not its tests'; the third rule reads the tests' direct imports.
func TestInternalFloors(t *testing.T) {
	for _, p := range modulePackages(t) {
		rel := p.rel()
		switch {
		case under(rel, "internal") && !under(rel, "internal/testenv"):
			for _, d := range p.Deps {
				if r, ok := inModule(d); ok && underAny(r, aboveDedup) {
					t.Errorf("%s is a ground helper and depends on %s, above dedup", rel, r)
				}
			}
		case under(rel, "dedup"):
			for _, d := range p.Deps {
				if r, ok := inModule(d); d == "net/http" || ok && under(r, "httpidem") {
					t.Errorf("%s is under dedup and depends on %s", rel, d)
				}
			}
		}
		if under(rel, "examples") || rel == faultSuite {
			continue
		}
		for _, imp := range slices.Concat(p.TestImports, p.XTestImports) {
			if r, ok := inModule(imp); ok && under(r, "examples") {
				t.Errorf("the tests of %s import %s: a workload of internal/testenv serves them", rel, r)
			}
		}
	}
}

const module = "github.com/idemkit/idem"

// listed is a package as go list -json describes it.
type listed struct {
	ImportPath                               string
	Deps, Imports, TestImports, XTestImports []string
}

func (p listed) rel() string { r, _ := inModule(p.ImportPath); return r }

// modulePackages lists the module's packages (cmd/idem-bench, a module of
// its own, is not among them).
func modulePackages(t *testing.T) []listed {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Deps,Imports,TestImports,XTestImports", "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []listed
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 || !slices.ContainsFunc(pkgs, func(p listed) bool { return p.ImportPath == module+"/dedup" }) {
		t.Fatalf("go list found %d packages and no dedup: not the module's root", len(pkgs))
	}
	return pkgs
}

// inModule returns path relative to the module's root ("" for the root).
func inModule(path string) (string, bool) {
	if path == module {
		return "", true
	}
	r, ok := strings.CutPrefix(path, module+"/")
	return r, ok
}

// under reports whether rel is dir or inside it.
func under(rel, dir string) bool { return rel == dir || strings.HasPrefix(rel, dir+"/") }

func underAny(rel string, dirs []string) bool {
	return slices.ContainsFunc(dirs, func(d string) bool { return under(rel, d) })
}
