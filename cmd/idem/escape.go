package main

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// inert makes a string that came from outside (a key, a reason, a letter's
// headers, a topic) safe to write to a terminal or into a console page's
// <pre> block: control characters (C0, DEL, C1), line and paragraph
// separators, bidirectional overrides and invalid UTF-8 are written
// escaped, as Go writes them (\x1b, \n, \u202e), so that an ANSI or OSC
// sequence or a newline comes out visible and does nothing. A string
// without any comes back as it was.
func inert(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || unsafeRune(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x80 && unsafeRune(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// unsafeRune reports the runes inert escapes.
func unsafeRune(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f: // C0, DEL, C1
		return true
	case r == 0x2028, r == 0x2029: // line and paragraph separators
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x200e, r == 0x200f, r == 0x061c: // bidi
		return true
	}
	return false
}

// inertAll is inert of each string.
func inertAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = inert(s)
	}
	return out
}
