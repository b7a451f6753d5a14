package main

import (
	"net/http"
	"os"
	"time"
)

// FaultHeader is the demo's per-request fault knob: a request carrying it
// misbehaves on purpose, so that every row of the behaviour matrix in
// docs/http.md can be shown with curl. The header is not part of the
// request's fingerprint: a retry without it is the same request. A real
// service has no such knob.
//
//	slow    hold the handler (Options.Hold) — a duplicate meanwhile gets 409; on
//	        /payouts held past the lease, the request that takes over pays and this one is fenced out
//	5xx     /callbacks: answer 500 without booking — stored, replayed, not run again;
//	        /payouts: pay, then answer 502 as if the bank's answer was lost — not stored, taken over
//	error   /callbacks: book, then fail — rolled back, nothing stored, a retry books;
//	        /payouts: the bank refused before paying — the lease is ended, a retry runs at once
//	panic   book or pay, then panic — 500; the callback rolled back, the payout taken over later
//	crash   book or pay, then kill the process mid-request (Options.Crash) — restart it and
//	        retry: the callback is booked, the payout taken over once its lease runs out, paid once
const FaultHeader = "Demo-Fault"

// The faults FaultHeader names.
const (
	faultSlow  = "slow"
	fault5xx   = "5xx"
	faultError = "error"
	faultPanic = "panic"
	faultCrash = "crash"
)

// withFaults refuses an unknown FaultHeader value with 400, before the
// idempotency middleware (nothing is stored), and a crash the options do
// not allow.
func withFaults(next http.Handler, opts Options) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch f := r.Header.Get(FaultHeader); f {
		case "", faultSlow, fault5xx, faultError, faultPanic:
		case faultCrash:
			if opts.Crash == nil {
				http.Error(w, FaultHeader+": crash is not enabled here", http.StatusBadRequest)
				return
			}
		default:
			http.Error(w, FaultHeader+": want slow, 5xx, error, panic or crash, not "+f, http.StatusBadRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// fault is the request's FaultHeader.
func fault(r *http.Request) string { return r.Header.Get(FaultHeader) }

// Kill kills this process at once, as the kernel's OOM killer or a power
// cut would: no deferred call runs, no response is sent, open transactions
// are rolled back by the database when their connections drop. It is the
// program's Options.Crash.
func Kill() {
	if p, err := os.FindProcess(os.Getpid()); err == nil && p.Kill() == nil { // SIGKILL on Unix
		time.Sleep(time.Minute) // the kernel ends the process meanwhile
	}
	os.Exit(137)
}
