// Package shorten shortens a failure reason to what the stores record.
package shorten

import "github.com/idemkit/idem/dedup"

// MaxLen bounds a recorded failure reason: dedup.MaxReasonLen.
const MaxLen = dedup.MaxReasonLen

// Reason cuts s to MaxLen bytes on a rune boundary.
func Reason(s string) string {
	if len(s) <= MaxLen {
		return s
	}
	cut := MaxLen
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut]
}
