package dedup_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/dedup"
)

// Alipay's trade_status as a rank, beside the time of the event: a trade
// that cannot be refunded is paid and finished in one second, and its
// TRADE_FINISHED must win over its TRADE_SUCCESS whichever comes last. A
// status the machine does not know is an error that names it.
func ExampleStatusRank() {
	trade := dedup.StatusRank("WAIT_BUYER_PAY", "TRADE_SUCCESS", "TRADE_FINISHED", "TRADE_CLOSED")
	at := time.Date(2026, 11, 30, 10, 4, 5, 0, time.FixedZone("CST", 8*3600)).Unix() // gmt_payment, gmt_close

	paid, _ := trade.At(at, "TRADE_SUCCESS")
	finished, _ := trade.At(at, "TRADE_FINISHED")
	fmt.Println(paid, finished, finished.Compare(paid))

	_, err := trade.At(at, "TRADE_PENDING")
	fmt.Println(errors.Is(err, dedup.ErrUnknownStatus), err)
	// Output:
	// 1796004245.2 1796004245.3 1
	// true dedup: unknown status "TRADE_PENDING": the known statuses are "WAIT_BUYER_PAY" < "TRADE_SUCCESS" < "TRADE_FINISHED" < "TRADE_CLOSED"
}
