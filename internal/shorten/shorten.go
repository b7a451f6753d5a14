// Package shorten shortens a failure reason to what the stores record.
package shorten

// MaxLen bounds a recorded failure reason: dedup.MaxReasonLen, which a
// test of dedup's holds it to. Ground stands below dedup, so the number is
// written twice.
const MaxLen = 500

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
