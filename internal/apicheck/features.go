package main

import (
	"go/types"
	"slices"
	"strings"
)

// Features lists pkg's exported API, one line per name, in the form of
// Go's api/go1.txt:
//
//	pkg P, const C untyped int = 500
//	pkg P, var V T
//	pkg P, func F[T any](context.Context, T) error
//	pkg P, type S struct
//	pkg P, type S struct, F int
//	pkg P, type I interface { M(int) error; N() }
//	pkg P, method (*S) M(int) error
//
// A change a user could notice changes or removes a line: a parameter's
// type, a method a type loses, a method an interface gains (its whole
// method set is one line, since an implementation outside the package
// would break). Parameter names are left out: renaming one breaks nothing.
// An interface with an unexported method cannot be implemented outside
// its package, so its methods get a line each and it may gain some.
func Features(pkg *types.Package) []string {
	w := writer{pkg: pkg, prefix: "pkg " + pkg.Path() + ", "}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch o := obj.(type) {
		case *types.Const:
			w.add("const " + name + " " + w.typ(o.Type()) + " = " + o.Val().ExactString())
		case *types.Var:
			w.add("var " + name + " " + w.typ(o.Type()))
		case *types.Func:
			w.add("func " + name + w.signature(o.Type().(*types.Signature)))
		case *types.TypeName:
			w.typeName(o)
		}
	}
	slices.Sort(w.out)
	return slices.Compact(w.out)
}

type writer struct {
	pkg    *types.Package
	prefix string
	out    []string
}

func (w *writer) add(s string) { w.out = append(w.out, w.prefix+s) }

// typ writes t with the package's own names unqualified, others by path,
// and the parameter names of function types left out.
func (w *writer) typ(t types.Type) string {
	return types.TypeString(unnamed(t), func(p *types.Package) string {
		if p == w.pkg {
			return ""
		}
		return p.Path()
	})
}

// signature writes sig's type parameters, parameters and results, without
// the receiver or the parameters' names: "[T any](int, ...string) error".
func (w *writer) signature(sig *types.Signature) string {
	var b strings.Builder
	if tps := sig.TypeParams(); tps.Len() > 0 {
		b.WriteString(w.typeParams(tps))
	}
	plain := types.NewSignatureType(nil, nil, nil, sig.Params(), sig.Results(), sig.Variadic())
	b.WriteString(strings.TrimPrefix(w.typ(plain), "func"))
	return b.String()
}

func (w *writer) typeParams(tps *types.TypeParamList) string {
	var parts []string
	for i := range tps.Len() {
		tp := tps.At(i)
		parts = append(parts, tp.Obj().Name()+" "+w.typ(tp.Constraint()))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func (w *writer) typeName(o *types.TypeName) {
	name := o.Name()
	if o.IsAlias() {
		w.add("type " + name + " = " + w.typ(o.Type()))
		return
	}
	named, ok := o.Type().(*types.Named)
	if !ok {
		w.add("type " + name + " " + w.typ(o.Type()))
		return
	}
	head := "type " + name
	if tps := named.TypeParams(); tps.Len() > 0 {
		head += w.typeParams(tps)
	}
	switch u := named.Underlying().(type) {
	case *types.Struct:
		w.add(head + " struct")
		for i := range u.NumFields() {
			f := u.Field(i)
			if !f.Exported() {
				continue
			}
			if f.Embedded() {
				w.add(head + " struct, embedded " + w.typ(f.Type()))
			} else {
				w.add(head + " struct, " + f.Name() + " " + w.typ(f.Type()))
			}
		}
	case *types.Interface:
		w.iface(head, u)
		return // an interface's methods are its type's line
	default:
		w.add(head + " " + w.typ(u))
	}
	// Methods: the value's, then those only the pointer has. Promoted
	// methods count: a user calls them the same way.
	value := types.NewMethodSet(named)
	for i := range value.Len() {
		if m := value.At(i).Obj(); m.Exported() {
			w.add("method (" + name + ") " + m.Name() + w.signature(m.Type().(*types.Signature)))
		}
	}
	ptr := types.NewMethodSet(types.NewPointer(named))
	for i := range ptr.Len() {
		m := ptr.At(i).Obj()
		if m.Exported() && value.Lookup(m.Pkg(), m.Name()) == nil {
			w.add("method (*" + name + ") " + m.Name() + w.signature(m.Type().(*types.Signature)))
		}
	}
}

func (w *writer) iface(head string, u *types.Interface) {
	if !u.IsMethodSet() { // a constraint: its type set is its API
		w.add(head + " " + w.typ(u))
		return
	}
	sealed := false
	var methods []string
	for i := range u.NumMethods() {
		m := u.Method(i)
		if !m.Exported() {
			sealed = true
			continue
		}
		methods = append(methods, m.Name()+w.signature(m.Type().(*types.Signature)))
	}
	slices.Sort(methods)
	if sealed {
		w.add(head + " interface, unexported methods")
		for _, m := range methods {
			w.add(head + " interface, " + m)
		}
		return
	}
	w.add(head + " interface { " + strings.Join(methods, "; ") + " }")
}

// unnamed returns t with the parameter and result names of the function
// types in it dropped, through pointers, slices, arrays, maps and
// channels. Named types, structs and interfaces are kept as they are.
func unnamed(t types.Type) types.Type {
	switch t := t.(type) {
	case *types.Signature:
		if t.TypeParams().Len() > 0 {
			return t
		}
		return types.NewSignatureType(nil, nil, nil, unnamedTuple(t.Params()), unnamedTuple(t.Results()), t.Variadic())
	case *types.Pointer:
		return types.NewPointer(unnamed(t.Elem()))
	case *types.Slice:
		return types.NewSlice(unnamed(t.Elem()))
	case *types.Array:
		return types.NewArray(unnamed(t.Elem()), t.Len())
	case *types.Map:
		return types.NewMap(unnamed(t.Key()), unnamed(t.Elem()))
	case *types.Chan:
		return types.NewChan(t.Dir(), unnamed(t.Elem()))
	}
	return t
}

func unnamedTuple(t *types.Tuple) *types.Tuple {
	if t == nil {
		return nil
	}
	vars := make([]*types.Var, t.Len())
	for i := range t.Len() {
		v := t.At(i)
		vars[i] = types.NewParam(v.Pos(), v.Pkg(), "", unnamed(v.Type()))
	}
	return types.NewTuple(vars...)
}
