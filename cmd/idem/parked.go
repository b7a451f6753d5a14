package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/dedup"
)

// Key order (consumer.NonBlocking.KeyOrdered): idem parked lists the
// record keys the store keeps parked — a key with a message in retry,
// whose later messages follow it there untried until they are the head —
// with the head, how many messages the key holds, how long it has been
// parked and how long its head has held it, and whether it outlived its
// limits (its messages are then dead-lettered as they come back).

// parkedJSON is a parked key as --json prints it.
type parkedJSON struct {
	Scope string `json:"scope"`
	Topic string `json:"topic"`
	Key   string `json:"key"`
	// KeyBase64 is the record key's bytes when they are not UTF-8 (Key
	// then has them replaced).
	KeyBase64 string    `json:"key_base64,omitempty"`
	Head      string    `json:"head"`
	HeadDelay string    `json:"head_delay"`
	Depth     int       `json:"depth"`
	ParkedAt  time.Time `json:"parked_at"`
	HeadSince time.Time `json:"head_since"`
	Expired   bool      `json:"expired"`
}

// runParked lists parked keys.
func runParked(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	var f dedup.ParkFilter
	fs.StringVar(&f.Scope, "scope", e.getenv("IDEM_SCOPE"), "only this scope (env IDEM_SCOPE)")
	fs.StringVar(&f.Topic, "topic", "", "only keys of this topic (the originals')")
	fs.StringVar(&f.Key, "key", "", "only this record key")
	fs.IntVar(&f.Limit, "limit", 100, "at most this many keys, the longest parked first")
	pos, code, ok := parse(fs, args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return usageErr(e, fs, "unexpected argument %q", inert(pos[0]))
	}
	if f.Limit <= 0 {
		return usageErr(e, fs, "--limit must be positive")
	}
	st, err := sf.openStore(ctx, false)
	if err != nil {
		return fail(e, err)
	}
	defer st.close()
	p, ok := st.journal.(dedup.Parking)
	if !ok {
		return fail(e, errors.New("the store keeps no parked keys (dedup.Parking)"))
	}
	keys, err := p.Parked(ctx, f)
	var stats dedup.ParkStats
	if err == nil {
		stats, err = p.ParkStats(ctx)
	}
	if errors.Is(err, dedup.ErrNotMigrated) {
		return fail(e, fmt.Errorf("the store's schema has no parked keys yet: run idem migrate (%w)", err))
	}
	if err != nil {
		return fail(e, err)
	}
	if sf.json {
		out := make([]parkedJSON, 0, len(keys))
		for _, k := range keys {
			j := parkedJSON{Scope: k.Scope, Topic: k.Topic, Key: k.Key, Head: k.Head, HeadDelay: k.HeadDelay.String(),
				Depth: k.Depth, ParkedAt: k.ParkedAt.UTC(), HeadSince: k.HeadSince.UTC(), Expired: k.Expired}
			if !utf8.ValidString(k.Key) {
				j.KeyBase64 = base64.StdEncoding.EncodeToString([]byte(k.Key))
			}
			out = append(out, j)
		}
		printJSON(e, out)
		return exitOK
	}
	now := time.Now()
	if len(keys) > 0 {
		writeParked(e.stdout, keys, now)
		fmt.Fprintln(e.stdout)
	}
	writeParkStats(e.stdout, stats, len(keys), now)
	return exitOK
}

// writeParked prints parked keys as a table, every field from outside
// inert; ages are from now.
func writeParked(w io.Writer, keys []dedup.ParkedKey, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tTOPIC\tKEY\tHEAD\tDEPTH\tPARKED_AGE\tHEAD_AGE\tEXPIRED")
	for _, k := range keys {
		scope := inert(k.Scope)
		if scope == "" {
			scope = "-"
		}
		expired := "no"
		if k.Expired {
			expired = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", scope, inert(k.Topic), inert(k.Key), inert(k.Head), k.Depth,
			duration(now.Sub(k.ParkedAt)), duration(now.Sub(k.HeadSince)), expired)
	}
	tw.Flush()
}

// writeParkStats prints the line under the table: how many keys are
// parked in all, and the oldest.
func writeParkStats(w io.Writer, st dedup.ParkStats, shown int, now time.Time) {
	if st.Keys == 0 {
		fmt.Fprintln(w, "no parked keys")
		return
	}
	keys := "keys"
	if st.Keys == 1 {
		keys = "key"
	}
	fmt.Fprintf(w, "%d parked %s in all (%d shown), the oldest parked %s ago: a key's messages wait behind its head in retry (KeyOrdered);\n"+
		"an expired key's messages are dead-lettered (parked_too_long) as they come back, and the key is released with its last.\n",
		st.Keys, keys, shown, duration(now.Sub(st.Oldest)))
}

// parkedView is the console's page of parked keys (GET /parked).
type parkedView struct {
	Filter dedup.ParkFilter
	Keys   []dedup.ParkedKey
	Stats  dedup.ParkStats
}

// parked lists the parked keys, the longest parked first, as idem parked
// does (scope, topic and key in the query filter them), with the total.
func (c *console) parked(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := parkedView{Filter: dedup.ParkFilter{Scope: q.Get("scope"), Topic: q.Get("topic"), Key: q.Get("key"), Limit: 100}}
	pg := page{Title: "Parked keys", Nav: "parked", Data: &v}
	p, ok := c.journal.(dedup.Parking)
	if !ok {
		pg.Error = "the store keeps no parked keys (dedup.Parking)"
		c.render(w, http.StatusOK, "parked", pg)
		return
	}
	keys, err := p.Parked(r.Context(), v.Filter)
	if err == nil {
		v.Stats, err = p.ParkStats(r.Context())
	}
	if errors.Is(err, dedup.ErrNotMigrated) {
		err = fmt.Errorf("the store's schema has no parked keys yet: run idem migrate (%w)", err)
	}
	if err != nil {
		pg.Error = err.Error()
		c.render(w, http.StatusOK, "parked", pg)
		return
	}
	v.Keys = keys
	c.render(w, http.StatusOK, "parked", pg)
}
