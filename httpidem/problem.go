package httpidem

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem/dedup"
)

// problem is an RFC 9457 problem detail. Its titles for the key's own
// errors are the IETF Idempotency-Key draft's.
type problem struct {
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// The problems the middleware answers with.
const (
	titleMissing   = "Idempotency-Key is missing"
	titleInvalid   = "Idempotency-Key is malformed"
	titleNoKey     = "The request names no valid key" // Route.Key's
	titleBusy      = "A request is outstanding for this Idempotency-Key"
	titleMismatch  = "Idempotency-Key is already used"
	titleTooLarge  = "Request body too large"
	titleBadBody   = "Request body cannot be fingerprinted"
	titleFailed    = "The request failed"
	titleStore     = "Idempotency store unavailable"
	titleStoreBusy = "Idempotency store busy"
	titleLost      = "Idempotency-Key was taken over"
	titleRespSize  = "Response too large to store"
)

// writeProblem answers with an application/problem+json body and, when
// retryAfter > 0, a Retry-After of at least one second.
func writeProblem(w http.ResponseWriter, status int, title, detail string, retryAfter time.Duration) {
	body, _ := json.Marshal(problem{Title: title, Status: status, Detail: detail})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Del("Idempotent-Replayed")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64(max((retryAfter+time.Second-1)/time.Second, 1)), 10))
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// problemResponse is a problem as a stored response.
func problemResponse(status int, title, detail string) dedup.StoredResponse {
	body, _ := json.Marshal(problem{Title: title, Status: status, Detail: detail})
	header, _ := json.Marshal([][2]string{{"Content-Type", "application/problem+json"}})
	return dedup.StoredResponse{Status: status, Header: header, Body: body}
}
