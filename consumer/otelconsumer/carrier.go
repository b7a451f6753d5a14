package otelconsumer

import (
	"unicode/utf8"

	"github.com/idemkit/idem/consumer"
)

// HeaderCarrier adapts a message's headers (Kafka headers, RocketMQ user
// properties) to propagation.TextMapCarrier. Keys match case-insensitively,
// as in HTTP.
type HeaderCarrier struct{ Headers *[]consumer.Header }

// Get returns the value of the first header named key.
func (c HeaderCarrier) Get(key string) string {
	for _, h := range *c.Headers {
		if equalFold(h.Key, key) {
			return string(h.Value)
		}
	}
	return ""
}

// Set replaces the header named key, or adds it.
func (c HeaderCarrier) Set(key, value string) {
	hs := *c.Headers
	for i := range hs {
		if equalFold(hs[i].Key, key) {
			hs[i].Value = []byte(value)
			return
		}
	}
	*c.Headers = append(hs, consumer.Header{Key: key, Value: []byte(value)})
}

// Keys lists the header names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, len(*c.Headers))
	for i, h := range *c.Headers {
		keys[i] = h.Key
	}
	return keys
}

// equalFold is strings.EqualFold for the ASCII header names propagators
// use, without its Unicode tables.
func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x >= utf8.RuneSelf || y >= utf8.RuneSelf {
			return false
		}
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
