package pgstore

import (
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// isConnLoss reports a connection that broke under a statement: EOF, a reset,
// a closed connection. pgx surfaces these without a SQLSTATE.
func isConnLoss(err error) bool {
	var netErr net.Error
	return errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) ||
		errors.As(err, &netErr)
}
