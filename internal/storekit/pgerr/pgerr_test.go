package pgerr_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/storekit/pgerr"
)

func TestClassify(t *testing.T) {
	cases := []struct {
		err  error
		want dedup.ErrorClass
	}{
		{&pgconn.PgError{Code: "40001"}, dedup.ClassConflict},
		{&pgconn.PgError{Code: "40P01"}, dedup.ClassConflict},
		{&pgconn.PgError{Code: "55P03"}, dedup.ClassConflict},
		{&pgconn.PgError{Code: "57014"}, dedup.ClassRetryable},
		{&pgconn.PgError{Code: "23505"}, dedup.ClassPermanent},
		{&pgconn.PgError{Code: "23503"}, dedup.ClassPermanent},
		{&pgconn.PgError{Code: "22P02"}, dedup.ClassPermanent},
		{&pgconn.PgError{Code: "57P01"}, dedup.ClassUnavailable},
		{&pgconn.PgError{Code: "25006"}, dedup.ClassUnavailable}, // read-only: a demoted primary
		{&pgconn.PgError{Code: "53100"}, dedup.ClassUnavailable}, // disk full
		{&pgconn.PgError{Code: "58030"}, dedup.ClassUnavailable}, // I/O error
		{&pgconn.PgError{Code: "08006"}, dedup.ClassUnavailable},
		{&pgconn.PgError{Code: "42P01"}, dedup.ClassFatal},   // undefined table: a broken deployment
		{&pgconn.PgError{Code: "42501"}, dedup.ClassFatal},   // insufficient privilege
		{&pgconn.PgError{Code: "P0001"}, dedup.ClassUnknown}, // raised by a trigger: the message's
		{pgx.ErrTxCommitRollback, dedup.ClassPermanent},
		{&dedup.ConnLostError{Store: "pgstore", Err: io.ErrUnexpectedEOF}, dedup.ClassUnavailable},
		{fmt.Errorf("wrapped: %w", &dedup.ConnLostError{Store: "pgstore", Err: pgconn.ErrConnClosed}), dedup.ClassUnavailable},
		// Errors a handler gets from elsewhere are not the database going away.
		{io.EOF, dedup.ClassUnknown},
		{io.ErrUnexpectedEOF, dedup.ClassUnknown},
		{context.DeadlineExceeded, dedup.ClassUnknown},
		{&url.Error{Op: "Post", URL: "http://127.0.0.1:1", Err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}, dedup.ClassUnknown},
		{pgx.ErrTxClosed, dedup.ClassUnknown},
		{errors.New("something else"), dedup.ClassUnknown},
	}
	for _, c := range cases {
		if got := pgerr.Classify(c.err); got != c.want {
			t.Errorf("Classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
