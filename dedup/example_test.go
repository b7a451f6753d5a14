package dedup_test

import (
	"errors"
	"fmt"
	"strings"

	"github.com/idemkit/idem/dedup"
)

// Keys are validated, never truncated or cleaned up: a key that cannot be
// stored as it is makes the message dead-lettered with ErrInvalidKey.
func ExampleKey_Validate() {
	for _, k := range []dedup.Key{
		{Scope: "payments", ID: "4200000001"},
		{Scope: "payments", ID: ""},
		{Scope: "payments", ID: strings.Repeat("x", 300)},
		{Scope: "payments", ID: "T1\n"},
		{Scope: "payments", ID: "\xff"},
	} {
		err := k.Validate()
		fmt.Printf("%-5t %v\n", errors.Is(err, dedup.ErrInvalidKey), err)
	}
	// Output:
	// false <nil>
	// true  dedup: invalid key: id is empty
	// true  dedup: invalid key: id is 300 bytes, the limit is 256
	// true  dedup: invalid key: id has control character U+000A at byte 2
	// true  dedup: invalid key: id is not valid UTF-8
}

// The fingerprint is taken over the payload's canonical form: the same JSON
// spelled another way (key order, spacing, escapes, number spelling) is the
// same payload, so a re-sent callback is a duplicate; another amount is not.
func ExampleFingerprintOf() {
	a := dedup.FingerprintOf([]byte(`{"txn_id":"4200000001","amount":1000,"note":"é"}`))
	b := dedup.FingerprintOf([]byte(`{ "note": "\u00e9", "amount": 1e3, "txn_id": "4200000001" }`))
	c := dedup.FingerprintOf([]byte(`{"txn_id":"4200000001","amount":1001,"note":"é"}`))
	fmt.Println("reordered and respelled:", a == b)
	fmt.Println("another amount:", a == c)
	// Output:
	// reordered and respelled: true
	// another amount: false
}
