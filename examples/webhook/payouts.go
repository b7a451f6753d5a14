package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/idemkit/idem/httpidem"
)

// PayoutRoute is the leased endpoint's pattern: a payout to a merchant,
// made at the bank, outside the webhook's database.
const PayoutRoute = "POST /payouts"

// payout is a payout request, and what the bank is asked to transfer.
type payout struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// payoutAnswer is the payout endpoint's answer.
type payoutAnswer struct {
	Transfer  int64  `json:"transfer"` // the bank's transfer
	Account   string `json:"account"`
	Amount    int64  `json:"amount"`
	Token     int64  `json:"token"`      // the fencing token of the lease that answered
	TakenOver bool   `json:"taken_over"` // an earlier request held the key and left no outcome
}

// payouts is the leased handler: the middleware has committed the key as
// Processing under a lease before it runs. It passes the key and the
// lease's token to the bank, which pays once per key and refuses a token
// older than one it saw. A request that takes the key over (the earlier
// holder crashed, answered 5xx or panicked) asks the bank the same way:
// the bank answers with the transfer the earlier holder made, if it made
// one, and never pays twice.
func payouts(bank *bankClient, opts Options) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		lease := httpidem.LeaseFrom(ctx)
		key, _ := httpidem.KeyFrom(ctx)
		var p payout
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Account == "" || p.Amount <= 0 {
			// Stored like any answer below 500: refused the same way again.
			http.Error(w, `want {"account":"…","amount":…}, the amount positive`, http.StatusBadRequest)
			return
		}
		switch fault(r) {
		case faultError:
			// The bank refused before paying: nothing happened, so give
			// the key up rather than make the retry wait for the lease.
			if err := lease.End(ctx); err != nil {
				opts.Logger.WarnContext(ctx, "payout: end the lease", "key", key, "err", err)
			}
			http.Error(w, FaultHeader+": error: the bank refused, nothing was paid; retry", http.StatusServiceUnavailable)
			return
		case faultSlow:
			if err := opts.Hold(ctx); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		t, err := bank.transfer(ctx, key, lease.Token(), p)
		switch {
		case errors.Is(err, errStaleToken):
			// Taken over while this request waited: the request that took
			// the key answers it. The middleware refuses this lease's
			// response too (409).
			http.Error(w, err.Error(), http.StatusConflict)
			return
		case err != nil:
			// Paid or not, nobody knows: not stored, the lease runs on,
			// and a retry takes the key over once it has run out.
			http.Error(w, "the bank did not answer: "+err.Error(), http.StatusBadGateway)
			return
		}
		switch fault(r) {
		case fault5xx:
			http.Error(w, FaultHeader+": 5xx: the bank's answer was lost (it paid)", http.StatusBadGateway)
			return
		case faultPanic:
			panic(fmt.Sprintf("%s: panic after transfer %d", FaultHeader, t.ID))
		case faultCrash:
			opts.Crash()
		}
		writeJSON(w, http.StatusCreated, payoutAnswer{Transfer: t.ID, Account: t.Account, Amount: t.Amount,
			Token: lease.Token(), TakenOver: lease.TakenOver()})
	}
}
