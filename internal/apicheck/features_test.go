package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"testing"
)

// TestRemovedSeesWhatBreaksAUser type-checks a package before and after
// a change and asks Removed whether the text baseline of the first calls
// the second incompatible.
func TestRemovedSeesWhatBreaksAUser(t *testing.T) {
	cases := []struct {
		name      string
		old, new  string
		wantBreak bool
	}{
		{"func removed", `func F() {}; func G() {}`, `func G() {}`, true},
		{"func added", `func F() {}`, `func F() {}; func G() {}`, false},
		{"parameter renamed", `func F(a int) {}`, `func F(b int) {}`, false},
		{"parameter type changed", `func F(a int) {}`, `func F(a int64) {}`, true},
		{"parameter added", `func F(a int) {}`, `func F(a int, more ...int) {}`, true},
		{"func-typed parameter's names renamed", `func F(fn func(a int) error) {}`, `func F(fn func(b int) error) {}`, false},
		{"field added", `type S struct{ A int }`, `type S struct{ A, B int }`, false},
		{"field type changed", `type S struct{ A int }`, `type S struct{ A string }`, true},
		{"unexported field added", `type S struct{ A int }`, `type S struct{ A int; b int }`, false},
		{"method added to an interface", `type I interface{ M() }`, `type I interface{ M(); N() }`, true},
		{"method added to a sealed interface", `type I interface{ M(); i() }`, `type I interface{ M(); N(); i() }`, false},
		{"method to pointer receiver", `type T int; func (T) M() {}`, `type T int; func (*T) M() {}`, true},
		{"method removed", `type T int; func (T) M() {}; func (T) N() {}`, `type T int; func (T) N() {}`, true},
		{"promoted method kept", `type T int; func (T) M() {}; type U struct{ T }`, `type T int; func (T) M() {}; type U struct{ T; x int }`, false},
		{"constant's value changed", `const C = 500`, `const C = 400`, true},
		{"type parameter's constraint narrowed", `func F[T any](T) {}`, `func F[T comparable](T) {}`, true},
		{"generic type's method", `type G[T any] struct{}; func (G[T]) M(T) {}`, `type G[T any] struct{}; func (G[T]) M(T, int) {}`, true},
		{"unexported changes", `func f() {}; type s int`, `func f(int) {}; type s string`, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			old, cur := Features(check(t, tc.old)), Features(check(t, tc.new))
			got := Removed(old, cur)
			if (len(got) > 0) != tc.wantBreak {
				t.Errorf("Removed = %q, want a break: %v\nold: %q\nnew: %q", got, tc.wantBreak, old, cur)
			}
		})
	}
}

func check(t *testing.T, src string) *types.Package {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", "package p; "+src, 0)
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := new(types.Config).Check("example.com/p", fset, []*ast.File{f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pkg
}
