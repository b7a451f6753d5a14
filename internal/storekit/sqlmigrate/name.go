package sqlmigrate

import (
	"fmt"
	"regexp"
)

// nameRE is what a name that the migrations render may be.
var nameRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}$`)

// CheckName returns an error, prefixed with pkg, unless name, the value of
// Config.field (a schema, a database or a table), is [a-z_][a-z0-9_]* and
// at most 48 bytes: a name that no database needs quoted, with room for
// the suffixes of the indexes and tables named after it.
func CheckName(pkg, field, name string) error {
	if nameRE.MatchString(name) {
		return nil
	}
	return fmt.Errorf("%s: Config.%s %q: want [a-z_][a-z0-9_]*, at most 48 bytes", pkg, field, name)
}
