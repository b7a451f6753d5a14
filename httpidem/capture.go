package httpidem

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/idemkit/idem/dedup"
)

// ErrResponseTooLarge: the handler wrote more than Route.MaxResponseBytes.
// The write fails with it, and the response is not sent. In a transactional
// route nothing commits: the client gets 500 and a retry runs again (and
// fails again, until the limit is raised). In a leased route the handler's
// effects have happened, so the key is finished with a stored 500 problem
// saying so: a retry replays it rather than repeating the effects.
var ErrResponseTooLarge = errors.New("httpidem: response too large to store")

// capture buffers a handler's response, so that it can be stored before it
// is sent: nothing reaches the client before the key's outcome is durable.
// Flush is accepted and does nothing. It is only used on routes with a key:
// other routes, and keyless requests of an Optional leased route, write to
// the connection directly and stream as they please.
type capture struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	max      int
	tooLarge bool
}

func newCapture(max int) *capture { return &capture{header: make(http.Header), max: max} }

func (c *capture) Header() http.Header { return c.header }

func (c *capture) WriteHeader(code int) {
	if c.status != 0 || code < 200 && code != http.StatusSwitchingProtocols {
		return // later calls, and 1xx informational responses, change nothing
	}
	c.status = code
}

func (c *capture) Write(p []byte) (int, error) {
	c.WriteHeader(http.StatusOK)
	if c.tooLarge || c.body.Len()+len(p) > c.max {
		c.tooLarge = true
		return 0, fmt.Errorf("%w: more than %d bytes", ErrResponseTooLarge, c.max)
	}
	return c.body.Write(p)
}

// Flush does nothing: the response goes out once it is stored.
func (c *capture) Flush() {}

// finish completes the response as net/http would: status 200 when none
// was written, a sniffed Content-Type for a body without one. A replay then
// sends what the first response sent.
func (c *capture) finish() {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if _, ok := c.header["Content-Type"]; !ok && c.body.Len() > 0 && c.header.Get("Content-Encoding") == "" {
		c.header.Set("Content-Type", http.DetectContentType(c.body.Bytes()))
	}
}

// response is what is stored: the status, the fields of stored, the body.
func (c *capture) response(stored map[string]bool) dedup.StoredResponse {
	var pairs [][2]string
	for name, vs := range c.header {
		if stored[name] {
			for _, v := range vs {
				pairs = append(pairs, [2]string{name, v})
			}
		}
	}
	slices.SortStableFunc(pairs, func(a, b [2]string) int {
		if a[0] < b[0] {
			return -1
		} else if a[0] > b[0] {
			return 1
		}
		return 0
	})
	header, _ := json.Marshal(pairs)
	return dedup.StoredResponse{Status: c.status, Header: header, Body: c.body.Bytes()}
}

// send writes the captured response to w.
func (c *capture) send(w http.ResponseWriter) {
	h := w.Header()
	for name, vs := range c.header {
		h[name] = vs
	}
	h.Set("Content-Length", strconv.Itoa(c.body.Len()))
	w.WriteHeader(c.status)
	_, _ = w.Write(c.body.Bytes())
}

// replay sends a stored response, with Idempotent-Replayed: true when it is
// a replay.
func replay(w http.ResponseWriter, res dedup.StoredResponse, replayed bool) error {
	var pairs [][2]string
	if len(res.Header) > 0 {
		if err := json.Unmarshal(res.Header, &pairs); err != nil {
			return fmt.Errorf("httpidem: stored header: %w", err)
		}
	}
	h := w.Header()
	for _, p := range pairs {
		h.Del(p[0]) // replace what an outer handler set, once per name
	}
	for _, p := range pairs {
		h.Add(p[0], p[1])
	}
	if replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	h.Set("Content-Length", strconv.Itoa(len(res.Body)))
	w.WriteHeader(res.Status)
	_, _ = w.Write(res.Body)
	return nil
}
