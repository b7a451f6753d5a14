package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"strings"
)

// secretFlag is a flag whose value is never printed: a Postgres URL with
// its password, the console's token, a metrics URL with credentials. Its
// default comes from an environment variable; --help shows "from $VAR",
// never the value. Given on the command line, it works but warns, since
// any local user reads a process's arguments (ps); NAME-file reads it from
// a file instead.
type secretFlag struct {
	value   *string
	env     string // the environment variable it defaults from
	fromEnv bool
	warn    io.Writer // where a value given on the command line is warned about
	name    string
	// secret reports whether a value holds a secret (a URL's password);
	// nil: every value is one (a token).
	secret func(string) bool
}

// registerSecret defines --name and --name-file, with the default from the
// environment variable env.
func registerSecret(fs *flag.FlagSet, e *env, p *string, name, envVar, usage string) {
	s := &secretFlag{value: p, env: envVar, warn: e.stderr, name: name}
	if name != "token" {
		s.secret = holdsCredentials
	}
	if v := e.getenv(envVar); v != "" {
		*p, s.fromEnv = v, true
	}
	fs.Var(s, name, usage+" (env "+envVar+"; not as an argument: ps shows it to every local user)")
	fs.Func(name+"-file", "read --"+name+" from this file (its first line)", func(path string) error {
		v, err := readSecretFile(path)
		if err != nil {
			return err
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 && s.warn != nil {
			fmt.Fprintf(s.warn, "idem: warning: --%s-file %s is readable by other users (mode %v): chmod 600 it\n", name, path, fi.Mode().Perm())
		}
		*p, s.fromEnv = v, false
		return nil
	})
}

func (s *secretFlag) String() string {
	switch {
	case s == nil || s.value == nil || *s.value == "":
		return ""
	case s.fromEnv:
		return "from $" + s.env
	}
	return "(set, not shown)"
}

func (s *secretFlag) Set(v string) error {
	*s.value, s.fromEnv = v, false
	if s.warn != nil && v != "" && (s.secret == nil || s.secret(v)) {
		fmt.Fprintf(s.warn, "idem: warning: --%s given as an argument is readable by every local user (ps): use $%s or --%s-file\n", s.name, s.env, s.name)
	}
	return nil
}

// readSecretFile reads a secret from the first line of a file, with the
// trailing newline and spaces removed. Its errors never hold the contents.
func readSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimSpace(line)
	if line == "" {
		return "", errors.New("the file is empty")
	}
	return line, nil
}

// holdsCredentials reports whether a URL (or a Postgres key=value
// connection string) holds a password or a query that may carry a token.
func holdsCredentials(s string) bool {
	if strings.Contains(strings.ToLower(s), "password=") {
		return true
	}
	u, err := url.Parse(s)
	if err != nil {
		return true // cannot tell: assume it does
	}
	_, hasPassword := u.User.Password()
	return hasPassword || u.RawQuery != ""
}

// redactURL is a URL as it may be shown: without its password and query
// (either may hold a credential); a malformed one is not shown at all.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "(a malformed URL, not shown)"
	}
	if u.RawQuery != "" {
		u.RawQuery = "…"
	}
	u.Fragment, u.RawFragment = "", ""
	return u.Redacted()
}

// flagValueInError finds the value a flag parse error quotes, which may be
// a secret mistyped into the wrong flag.
var flagValueInError = regexp.MustCompile(`^invalid (boolean )?value ".*" for (flag )?(-[^\s:]+)`)

// flagError is a flag parse error without the value that was given.
func flagError(err error) string {
	return flagValueInError.ReplaceAllString(err.Error(), "invalid ${1}value for ${2}${3}")
}
