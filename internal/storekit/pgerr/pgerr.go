// Package pgerr sorts Postgres errors into dedup's error classes, once for
// everything of idem that runs on pgx (dedup/pgstore, outbox): by SQLSTATE
// (*pgconn.PgError), a lost connection (*dedup.ConnLostError) and a failed
// connect (*pgconn.ConnectError).
package pgerr

import (
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/dedup"
)

// Classify sorts a Postgres error:
//   - 40001 serialization failure, 40P01 deadlock, 55P03 lock not available:
//     conflict (retried whole, not counted against the message);
//   - 57014 statement timeout: retryable (bounded);
//   - 57P01..57P03 (shutdown, cannot connect now), class 53 (disk full, out
//     of memory, too many connections), class 58 (I/O error), 25006 (a
//     read-only transaction: a demoted primary), class 08 (connection
//     exceptions), a *dedup.ConnLostError (a store saw its connection die)
//     or a failed connect: unavailable (waited out, never dead-lettered). An
//     EOF or network error a handler got from somewhere else is not: it
//     counts against the message's retries;
//   - class 23 (integrity constraint violation), class 22 (data exception),
//     and pgx.ErrTxCommitRollback (a COMMIT that became ROLLBACK because a
//     statement failed and the error was swallowed): permanent;
//   - class 42 (undefined table or column, syntax error, 42501 insufficient
//     privilege), 3F000 (no such schema), 0A000 (feature not supported):
//     fatal — a broken deployment stops the consumer, nothing dead-lettered.
//     A handler whose SQL depends on the message (a table per tenant) and
//     can meet such an error for one message alone wraps it in
//     consumer.Permanent, which dead-letters that message instead;
//   - anything else: unknown, retried within the message's budget.
func Classify(err error) dedup.ErrorClass {
	if err == nil {
		return dedup.ClassUnknown
	}
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		return dedup.ClassPermanent
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch code := pgErr.Code; {
		case code == "40001", code == "40P01", code == "55P03":
			return dedup.ClassConflict
		case code == "57014":
			return dedup.ClassRetryable
		case code == "57P01", code == "57P02", code == "57P03", code[:2] == "08",
			code[:2] == "53", code[:2] == "58", code == "25006":
			// Shut down, insufficient resources (disk full, out of memory,
			// too many connections), system I/O errors, a read-only
			// transaction (a connection string that still reaches a
			// demoted primary): the database cannot take writes now.
			return dedup.ClassUnavailable
		case code[:2] == "23", code[:2] == "22":
			return dedup.ClassPermanent
		case code[:2] == "42", code == "3F000", code == "0A000":
			// Undefined table or column, syntax, insufficient privilege,
			// no such schema, unsupported feature: the deployment is
			// broken, and every message would fail the same way.
			return dedup.ClassFatal
		}
		return dedup.ClassUnknown
	}
	var lost *dedup.ConnLostError
	var connErr *pgconn.ConnectError
	if errors.As(err, &lost) || errors.As(err, &connErr) {
		return dedup.ClassUnavailable
	}
	return dedup.ClassUnknown
}

// Code returns the SQLSTATE of the Postgres error err wraps, "" when it
// wraps none.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}
