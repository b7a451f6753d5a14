package readmetest

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fragmentImports are the packages a fragment may use without importing
// them, each with a use that keeps the import legal when a fragment does not
// need it.
var fragmentImports = []struct{ path, use string }{
	{"context", "context.Background"},
	{"database/sql", "sql.ErrNoRows"},
	{"encoding/json", "json.Unmarshal"},
	{"errors", "errors.Is"},
	{"fmt", "fmt.Sprint"},
	{"log", "log.Fatal"},
	{"log/slog", "slog.Default"},
	{"os", "os.Getenv"},
	{"os/signal", "signal.NotifyContext"},
	{"syscall", "syscall.SIGTERM"},
	{"time", "time.Second"},
	{"github.com/jackc/pgx/v5", "pgx.ErrNoRows"},
	{"github.com/jackc/pgx/v5/pgxpool", "pgxpool.New"},
	{"github.com/idemkit/idem/adapters/kafka", "kafka.New"},
	{"github.com/idemkit/idem/adapters/rocketmq", "rocketmq.New"},
	{"github.com/idemkit/idem/consumer", "consumer.Permanent"},
	{"github.com/idemkit/idem/consumer/consumertest", "consumertest.Message"},
	{"github.com/idemkit/idem/consumer/otelconsumer", "otelconsumer.New"},
	{"github.com/idemkit/idem/dedup", "dedup.FingerprintOf"},
	{"github.com/idemkit/idem/dedup/memstore", "memstore.New"},
	{"github.com/idemkit/idem/dedup/pgstore", "pgstore.New"},
	{"github.com/idemkit/idem/dedup/sqlitestore", "sqlitestore.Open"},
	{"github.com/idemkit/idem/outbox", "outbox.New"},
	{"github.com/idemkit/idem/outbox/kafkapub", "kafkapub.New"},
	{"github.com/idemkit/idem/outbox/rocketmqpub", "rocketmqpub.New"},
}

// inScope is what every fragment may use without declaring it.
const inScope = `package fragments

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup/pgstore"
)

var (
	ctx     = context.Background()
	pool    *pgxpool.Pool
	brokers []string

	// What the handler block builds, for the blocks after it.
	store *pgstore.Store
	src   consumer.Source
	dlq   consumer.DeadLetter
)
`

const skipMarker = "// readme: not compiled:"

// block is one ```go block of the README.
type block struct {
	line int // README line of the block's first line of code
	code string
}

// goBlocks returns the ```go blocks of the Markdown file at path.
func goBlocks(path string) ([]block, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		blocks []block
		cur    *block
		other  bool // inside a fence of another language
		n      int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		fence := strings.HasPrefix(strings.TrimSpace(line), "```")
		switch {
		case cur != nil && fence:
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.code += line + "\n"
		case other && fence:
			other = false
		case other:
		case strings.TrimSpace(line) == "```go":
			if line != "```go" {
				return nil, fmt.Errorf("%s:%d: an indented ```go block; the test reads only blocks at the margin", path, n)
			}
			cur = &block{line: n + 1}
		case fence:
			other = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: a ```go block that never ends", path, cur.line-1)
	}
	return blocks, nil
}

// isFile reports whether code is a whole file: its first line that is not a
// comment or blank is a package clause.
func isFile(code string) bool {
	for _, l := range strings.Split(code, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "//") {
			continue
		}
		return strings.HasPrefix(l, "package ")
	}
	return false
}

// checkFormatted reports the first line where gofmt's output got differs
// from src, whose first line is README line first. indent is what the
// wrapping added in front of each line.
func checkFormatted(t *testing.T, first int, src, got, indent string) {
	t.Helper()
	if got == src {
		return
	}
	a, b := strings.Split(src, "\n"), strings.Split(got, "\n")
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			t.Errorf("README.md:%d: not gofmt-clean; gofmt makes the line\n\t%s\ninto\n\t%s",
				first+i, strings.TrimPrefix(a[i], indent), strings.TrimPrefix(b[i], indent))
			return
		}
	}
	t.Errorf("README.md:%d: not gofmt-clean (the lines gofmt adds or drops are at the end)", first+min(len(a), len(b)))
}

// TestREADMEBlocksCompile writes every ```go block of README.md into a
// package inside the module (see the package doc for the convention) and runs
// go build and go vet on them.
func TestREADMEBlocksCompile(t *testing.T) {
	readme, err := filepath.Abs(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := goBlocks(readme)
	if err != nil {
		t.Fatal(err)
	}
	// Inside the module, so that idem's packages and its dependencies resolve;
	// a directory starting with "_" is ignored by ./... patterns.
	dir, err := os.MkdirTemp(".", "_readme-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	frags := filepath.Join(dir, "fragments")
	if err := os.Mkdir(frags, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(path, src string) {
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(frags, "in_scope.go"), inScope)

	pkgs := []string{"./" + filepath.ToSlash(frags)}
	compiled := 0
	for _, b := range blocks {
		where := fmt.Sprintf("README.md:%d", b.line)
		first, _, _ := strings.Cut(b.code, "\n")
		if strings.HasPrefix(strings.TrimSpace(first), "// readme:") {
			reason, ok := strings.CutPrefix(strings.TrimSpace(first), skipMarker)
			if !ok || strings.TrimSpace(reason) == "" {
				t.Errorf("%s: a block leaves itself out only with %q and a reason", where, skipMarker+" <reason>")
			}
			continue
		}
		if strings.TrimSpace(b.code) == "" {
			t.Errorf("%s: an empty ```go block", where)
			continue
		}
		directive := fmt.Sprintf("//line %s:%d\n", readme, b.line)
		if isFile(b.code) {
			if got, err := format.Source([]byte(b.code)); err == nil {
				checkFormatted(t, b.line, b.code, string(got), "")
			}
			pkg := filepath.Join(dir, fmt.Sprintf("file%d", b.line))
			if err := os.Mkdir(pkg, 0o755); err != nil {
				t.Fatal(err)
			}
			write(filepath.Join(pkg, "block.go"), directive+b.code)
			pkgs = append(pkgs, "./"+filepath.ToSlash(pkg))
			compiled++
			continue
		}
		// gofmt a fragment as the body of a function: indented by one tab.
		var body strings.Builder
		for _, l := range strings.SplitAfter(b.code, "\n") {
			if strings.TrimSpace(l) != "" {
				body.WriteString("\t")
			}
			body.WriteString(l)
		}
		wrapped := "package p\n\nfunc _() {\n" + body.String() + "}\n"
		if got, err := format.Source([]byte(wrapped)); err == nil {
			checkFormatted(t, b.line-3, wrapped, string(got), "\t")
		}
		var src bytes.Buffer
		src.WriteString("package fragments\n\nimport (\n")
		for _, imp := range fragmentImports {
			fmt.Fprintf(&src, "\t%q\n", imp.path)
		}
		src.WriteString(")\n\nvar (\n")
		for _, imp := range fragmentImports {
			fmt.Fprintf(&src, "\t_ = %s\n", imp.use)
		}
		src.WriteString(")\n\nfunc _() {\n" + directive + b.code + "}\n")
		write(filepath.Join(frags, fmt.Sprintf("block%d.go", b.line)), src.String())
		compiled++
	}
	if compiled == 0 {
		t.Fatal("README.md has no ```go block to compile")
	}
	t.Logf("%d of %d blocks compiled", compiled, len(blocks))

	var flags []string
	if raceEnabled {
		flags = append(flags, "-race")
	}
	for _, verb := range []string{"build", "vet"} {
		args := append(append([]string{verb}, flags...), pkgs...)
		cmd := exec.CommandContext(t.Context(), "go", args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s of the README's blocks: %v\n%s", verb, err, out)
		}
	}
	for _, msg := range droppedErrors(t, flags, pkgs) {
		t.Error(msg)
	}
}

// droppedErrors type-checks the blocks' packages against the export data of
// their imports (from go list -export) and reports every error a block drops:
// a call statement or a go statement whose call returns an error, and an
// error assigned to _. A deferred call (defer f.Close()) and the fmt package
// are let through. go vet does not look for these; code a user copies
// should not drop errors.
func droppedErrors(t *testing.T, flags, pkgs []string) []string {
	t.Helper()
	args := append(append([]string{"list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}"}, flags...), pkgs...)
	out, err := exec.CommandContext(t.Context(), "go", args...).Output()
	if err != nil {
		t.Fatalf("go list -export: %v", err)
	}
	exports := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if path, file, ok := strings.Cut(l, "\t"); ok && file != "" {
			exports[path] = file
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
	errType := types.Universe.Lookup("error").Type()
	isErr := func(tv types.Type) bool { return tv != nil && types.Identical(tv, errType) }
	var msgs []string
	for _, pkg := range pkgs {
		names, err := filepath.Glob(filepath.Join(pkg, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		var files []*ast.File
		for _, name := range names {
			f, err := parser.ParseFile(fset, name, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Uses: map[*ast.Ident]types.Object{}}
		if _, err := (&types.Config{Importer: imp}).Check(pkg, fset, files, info); err != nil {
			t.Fatalf("type-checking %s: %v", pkg, err)
		}
		// results returns the result types of call, nil for fmt's functions.
		results := func(call *ast.CallExpr) []types.Type {
			fun := call.Fun
			if sel, ok := fun.(*ast.SelectorExpr); ok {
				fun = sel.Sel
			}
			if id, ok := fun.(*ast.Ident); ok {
				if obj := info.Uses[id]; obj != nil && obj.Pkg() != nil && obj.Pkg().Path() == "fmt" {
					return nil
				}
			}
			switch tv := info.Types[call].Type.(type) {
			case *types.Tuple:
				var ts []types.Type
				for v := range tv.Variables() {
					ts = append(ts, v.Type())
				}
				return ts
			case nil:
				return nil
			default:
				return []types.Type{tv}
			}
		}
		report := func(n ast.Node, what string) {
			p := fset.Position(n.Pos())
			msgs = append(msgs, fmt.Sprintf("%s:%d: %s", filepath.Base(p.Filename), p.Line, what))
		}
		for _, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.ExprStmt:
					if call, ok := n.X.(*ast.CallExpr); ok && slices.ContainsFunc(results(call), isErr) {
						report(n, "the error this call returns is dropped")
					}
				case *ast.GoStmt:
					if slices.ContainsFunc(results(n.Call), isErr) {
						report(n, "go drops the error this call returns")
					}
				case *ast.AssignStmt:
					var rhs []types.Type
					if call, ok := n.Rhs[0].(*ast.CallExpr); ok && len(n.Rhs) == 1 {
						rhs = results(call)
					} else {
						for _, e := range n.Rhs {
							if _, ok := e.(*ast.CallExpr); ok {
								rhs = append(rhs, info.Types[e].Type)
							} else {
								rhs = append(rhs, nil)
							}
						}
					}
					for i, l := range n.Lhs {
						if id, ok := l.(*ast.Ident); ok && id.Name == "_" && i < len(rhs) && isErr(rhs[i]) {
							report(n, "an error is assigned to _")
						}
					}
				}
				return true
			})
		}
	}
	return msgs
}
