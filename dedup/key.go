package dedup

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Bounds of a key. They match the CHECK constraints of the stores' tables.
const (
	MaxScopeLen = 128 // bytes
	MaxIDLen    = 256 // bytes
)

// Key names one business effect: Scope separates consumers and tenants, ID is
// the message ID or business key within the scope.
type Key struct {
	Scope string
	ID    string
}

func (k Key) String() string { return k.Scope + "|" + k.ID }

// Validate reports whether k can be stored. Keys are rejected, never
// truncated: a truncated key would merge distinct effects. The error wraps
// [ErrInvalidKey] and says what is wrong.
func (k Key) Validate() error {
	if err := validatePart("scope", k.Scope, MaxScopeLen); err != nil {
		return err
	}
	return validatePart("id", k.ID, MaxIDLen)
}

func validatePart(name, s string, max int) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: %s is empty", ErrInvalidKey, name)
	case len(s) > max:
		return fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrInvalidKey, name, len(s), max)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidKey, name)
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: %s has control character %U at byte %d", ErrInvalidKey, name, r, i)
		}
	}
	return nil
}
