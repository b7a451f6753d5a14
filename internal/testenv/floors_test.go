package testenv

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"
)

// The floors of docs/STYLE: dedup is the bottom of the library; the engine,
// the effect journal's steps, the source and outbox drivers, the HTTP
// middleware, observability, the examples and the commands stand on it.
var aboveDedup = []string{"consumer", "effect", "adapters", "outbox", "httpidem", "observe", "examples", "cmd"}

// storeKit is the floor between dedup and the stores: the helpers every SQL
// store shares (error classes, row scanning, the migration runner), which
// speak dedup's types.
const storeKit = "internal/storekit"

// TestInternalFloors fails when a package stands on the wrong floor:
//   - a ground helper in internal/ (outside internal/testenv, whose
//     harnesses may use anything, and internal/storekit) depends on dedup or
//     a package above it;
//   - a store-kit helper (internal/storekit) depends on a package above
//     dedup;
//   - a public test kit (a package named *test outside internal/, such as
//     dedup/deduptest, which users import) depends on internal/testenv;
//   - a package under dedup/ depends on httpidem or net/http;
//   - the tests of a package outside examples/ import an example.
//
// Dependencies are transitive (go list's Deps) and count the package's own
// files, not its tests'; the last rule reads the tests' direct imports. The
// fault-injection suite (internal/testenv/faults), whose tests run the
// payments consumer of examples/payments, is a module of its own and not
// listed: no rule reads it.
func TestInternalFloors(t *testing.T) {
	for _, p := range modulePackages(t) {
		rel := p.rel()
		switch {
		case under(rel, storeKit):
			for _, d := range p.Deps {
				if r, ok := inModule(d); ok && underAny(r, aboveDedup) {
					t.Errorf("%s is a store-kit helper and depends on %s, above dedup", rel, r)
				}
			}
		case under(rel, "internal") && !under(rel, "internal/testenv"):
			for _, d := range p.Deps {
				if r, ok := inModule(d); ok && (under(r, "dedup") || underAny(r, aboveDedup)) {
					t.Errorf("%s is a ground helper and depends on %s: ground stands below dedup (a helper that needs dedup belongs in %s)", rel, r, storeKit)
				}
			}
		case under(rel, "dedup"):
			for _, d := range p.Deps {
				if r, ok := inModule(d); d == "net/http" || ok && under(r, "httpidem") {
					t.Errorf("%s is under dedup and depends on %s", rel, d)
				}
			}
		}
		if publicKit(rel) {
			for _, d := range p.Deps {
				if r, ok := inModule(d); ok && under(r, "internal/testenv") {
					t.Errorf("%s is a test kit users import and depends on %s, a harness of this repository's own tests", rel, r)
				}
			}
		}
		if under(rel, "examples") {
			continue
		}
		for _, imp := range slices.Concat(p.TestImports, p.XTestImports) {
			if r, ok := inModule(imp); ok && under(r, "examples") {
				t.Errorf("the tests of %s import %s: a workload of internal/testenv serves them", rel, r)
			}
		}
	}
}

// publicKit reports whether rel is a test kit users import: a package named
// *test outside internal/ (dedup/deduptest, httpidem/httpidemtest).
func publicKit(rel string) bool {
	return !under(rel, "internal") && strings.HasSuffix(path.Base(rel), "test")
}

const module = "github.com/idemkit/idem"

// listed is a package as go list -json describes it.
type listed struct {
	ImportPath                               string
	Deps, Imports, TestImports, XTestImports []string
}

func (p listed) rel() string { r, _ := inModule(p.ImportPath); return r }

// modulePackages lists the module's packages (the nested modules,
// cmd/idem-bench, deploy, internal/apicheck and internal/testenv/faults, are
// not among them).
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
