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
	{"cmp", "cmp.Compare[int]"},
	{"context", "context.Background"},
	{"database/sql", "sql.ErrNoRows"},
	{"encoding/json", "json.Unmarshal"},
	{"errors", "errors.Is"},
	{"fmt", "fmt.Sprint"},
	{"io", "io.EOF"},
	{"log", "log.Fatal"},
	{"log/slog", "slog.Default"},
	{"net/http", "http.MethodPost"},
	{"net/url", "url.ParseQuery"},
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
	{"github.com/idemkit/idem/consumer/source", "source.Description{}"},
	{"github.com/idemkit/idem/consumer/wire", "wire.ParseCause"},
	{"github.com/idemkit/idem/dedup", "dedup.FingerprintOf"},
	{"github.com/idemkit/idem/dedup/memstore", "memstore.New"},
	{"github.com/idemkit/idem/dedup/pgstore", "pgstore.New"},
	{"github.com/idemkit/idem/dedup/sqlitestore", "sqlitestore.Open"},
	{"github.com/idemkit/idem/httpidem", "httpidem.Scope"},
	{"github.com/idemkit/idem/observe", "observe.New"},
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
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/dedup/pgstore"
)

var (
	ctx     = context.Background()
	pool    *pgxpool.Pool
	brokers []string

	// What the handler block builds, for the blocks after it.
	store *pgstore.Store
	src   source.Source
	dlq   consumer.DeadLetter
)
`

const skipMarker = "// readme: not compiled:"

// block is one ```go block of a Markdown page.
type block struct {
	file string // the page, relative to the module's root: README.md, docs/keys.md
	line int    // the page's line of the block's first line of code
	code string
}

// where is the block's position as file:line.
func (b block) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// docPages returns the pages whose Go blocks are compiled: README.md and
// every docs/*.md, relative to root, README first and the rest sorted.
func docPages(root string) ([]string, error) {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	pages := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			return nil, err
		}
		pages = append(pages, filepath.ToSlash(rel))
	}
	slices.Sort(pages[1:])
	return pages, nil
}

// goBlocks returns the ```go blocks of the Markdown page file under root.
func goBlocks(root, file string) ([]block, error) {
	f, err := os.Open(filepath.Join(root, file))
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
				return nil, fmt.Errorf("%s:%d: an indented ```go block; the test reads only blocks at the margin", file, n)
			}
			cur = &block{file: file, line: n + 1}
		case fence:
			other = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: a ```go block that never ends", file, cur.line-1)
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
// from src, whose first line is line first of file. indent is what the
// wrapping added in front of each line.
func checkFormatted(t *testing.T, file string, first int, src, got, indent string) {
	t.Helper()
	if got == src {
		return
	}
	a, b := strings.Split(src, "\n"), strings.Split(got, "\n")
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			t.Errorf("%s:%d: not gofmt-clean; gofmt makes the line\n\t%s\ninto\n\t%s",
				file, first+i, strings.TrimPrefix(a[i], indent), strings.TrimPrefix(b[i], indent))
			return
		}
	}
	t.Errorf("%s:%d: not gofmt-clean (the lines gofmt adds or drops are at the end)", file, first+min(len(a), len(b)))
}

// moduleRoot is the module's root directory, two levels above this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// nameOf turns a page and line into a name for a file or directory of the
// generated packages: docs/keys.md, 12 -> docs_keys_12.
func nameOf(b block) string {
	base := strings.TrimSuffix(b.file, ".md")
	base = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, base)
	return fmt.Sprintf("%s_%d", base, b.line)
}

// TestDocBlocksCompile writes every ```go block of README.md and docs/*.md
// into a package inside the module (see the package doc for the
// convention) and runs go build and go vet on them.
func TestDocBlocksCompile(t *testing.T) {
	root := moduleRoot(t)
	pages, err := docPages(root)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []block
	for _, page := range pages {
		bs, err := goBlocks(root, page)
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, bs...)
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
	compiled := map[string]int{}
	for _, b := range blocks {
		first, _, _ := strings.Cut(b.code, "\n")
		if strings.HasPrefix(strings.TrimSpace(first), "// readme:") {
			reason, ok := strings.CutPrefix(strings.TrimSpace(first), skipMarker)
			if !ok || strings.TrimSpace(reason) == "" {
				t.Errorf("%s: a block leaves itself out only with %q and a reason", b.where(), skipMarker+" <reason>")
			}
			continue
		}
		if strings.TrimSpace(b.code) == "" {
			t.Errorf("%s: an empty ```go block", b.where())
			continue
		}
		directive := fmt.Sprintf("//line %s:%d\n", filepath.Join(root, b.file), b.line)
		if isFile(b.code) {
			if got, err := format.Source([]byte(b.code)); err == nil {
				checkFormatted(t, b.file, b.line, b.code, string(got), "")
			}
			pkg := filepath.Join(dir, "file_"+nameOf(b))
			if err := os.Mkdir(pkg, 0o755); err != nil {
				t.Fatal(err)
			}
			write(filepath.Join(pkg, "block.go"), directive+b.code)
			pkgs = append(pkgs, "./"+filepath.ToSlash(pkg))
			compiled[b.file]++
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
			checkFormatted(t, b.file, b.line-3, wrapped, string(got), "\t")
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
		write(filepath.Join(frags, "block_"+nameOf(b)+".go"), src.String())
		compiled[b.file]++
	}
	if compiled["README.md"] == 0 {
		t.Fatal("README.md has no ```go block to compile")
	}
	total := 0
	for _, page := range pages {
		if compiled[page] > 0 {
			t.Logf("%s: %d blocks compiled", page, compiled[page])
		}
		total += compiled[page]
	}
	t.Logf("%d of %d blocks compiled, from %d pages", total, len(blocks), len(pages))

	var flags []string
	if raceEnabled {
		flags = append(flags, "-race")
	}
	for _, verb := range []string{"build", "vet"} {
		args := append(append([]string{verb}, flags...), pkgs...)
		cmd := exec.CommandContext(t.Context(), "go", args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s of the documentation's blocks: %v\n%s", verb, err, out)
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
	root := moduleRoot(t)
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
			name := p.Filename
			if rel, err := filepath.Rel(root, name); err == nil && !strings.HasPrefix(rel, "..") {
				name = filepath.ToSlash(rel)
			}
			msgs = append(msgs, fmt.Sprintf("%s:%d: %s", name, p.Line, what))
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
