package main

// The table-size rows (issue 29, "Table size"): idem-b100 and idem-b1 on a
// dedup table that already holds N keys.
//
//	idem-bench -prefill 0,1000000,10000000,30000000 [-prefill-rows idem-b100,idem-b1]
//
// runs, after the -rows rows (none unless -rows is given), for each N in
// increasing order: fill the table to N keys, then the rows idem-b100@N and
// idem-b1@N on it. One table grows from step to step (the keys the rows
// insert stay in it and are counted). Each step
//
//   - drops the table's indexes, INSERT … SELECT generate_series in chunks
//     of a million (random keys of 36 to 64 bytes: a UUID and part of an
//     md5; 32-byte fingerprints; expires_at spread over the retention
//     window, so that nothing is expired and the purge has nothing to do),
//     then rebuilds the indexes (a sort, far faster than a random insert
//     per key) and runs VACUUM (ANALYZE): hint bits, the visibility map and
//     statistics are set before the measured rows, as autovacuum leaves a
//     table that has been in use;
//   - runs the rows with keys of the same shape: the message's txn_id,
//     hashed with the row's name (sha256), as a UUID and up to 28 more hex
//     digits. They fall at random places in the primary key, as real keys
//     do; the benchmark's own keys (T000000000001, …) would all go to the
//     index's right edge and never leave the cache. The rows' scope is the
//     prefilled keys' ("bench") and their store has the same Retention.
//
// Per row it records, besides the usual columns, the buffer hits and reads
// of the table and of its primary key over the row (pg_statio_user_tables
// and pg_statio_user_indexes, with every pool connection's statistics
// flushed first), and the table's and its indexes' sizes after it.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup/pgstore"
)

// tableSizeSettings are the table-size flags; part of settings.
type tableSizeSettings struct {
	Prefill          string        `json:"prefill,omitempty"`
	PrefillRows      string        `json:"prefill_rows,omitempty"`
	PrefillRetention time.Duration `json:"prefill_retention_ns,omitempty"`
	PrefillMessages  int           `json:"prefill_row_messages,omitempty"`
	PrefillSlow      int           `json:"prefill_row_slow_messages,omitempty"`
	PrefillControl   bool          `json:"prefill_control,omitempty"`
	PrefillKeep      bool          `json:"-"`
	PrefillPrewarm   bool          `json:"prefill_prewarm,omitempty"`
	// What the server ran with, read at the start.
	SharedBuffers string `json:"shared_buffers,omitempty"`
}

func tableSizeFlags(t *tableSizeSettings) {
	flag.StringVar(&t.Prefill, "prefill", "", "table-size rows: key counts to prefill the dedup table to, in increasing order (0,1000000,10000000,30000000); runs -prefill-rows at each as <row>@<count> (idem-b100@10M), after the -rows rows (none unless -rows is given)")
	flag.StringVar(&t.PrefillRows, "prefill-rows", "idem-b100,idem-b1", "the rows run at each -prefill count: idem-b100, idem-b1")
	flag.DurationVar(&t.PrefillRetention, "prefill-retention", 7*24*time.Hour, "the table-size rows' pgstore Retention; the prefilled keys' expires_at are spread over it")
	flag.IntVar(&t.PrefillMessages, "prefill-messages", 50000, "messages each table-size row of batch 100 drains")
	flag.IntVar(&t.PrefillSlow, "prefill-slow-messages", 10000, "messages each table-size row of batch 1 drains")
	flag.BoolVar(&t.PrefillControl, "prefill-control", true, "before idem-b100@N (N > 0), run it on an empty table of its own as idem-b100@0/N: the empty-table rate under the same load")
	flag.BoolVar(&t.PrefillPrewarm, "prefill-prewarm", true, "after each fill, read the primary key into shared_buffers (pg_prewarm), as a table in use has it there as far as it fits; the fill itself bypasses them")
	flag.BoolVar(&t.PrefillKeep, "prefill-keep", false, "keep the filled table at the end (its schema is printed), to look at it")
}

var prefillRows = []string{"idem-b100", "idem-b1"}

// tableStats is a table-size row's view of the dedup table.
type tableStats struct {
	// Keys in the table when the row started: prefilled, and inserted by
	// the rows before it.
	Keys      int64 `json:"keys"`
	Prefilled int64 `json:"prefilled_keys"`
	// Buffer hits and reads (from the OS, its page cache or the disk) over
	// the row: the heap, and the primary key.
	HeapHit  int64   `json:"heap_blocks_hit"`
	HeapRead int64   `json:"heap_blocks_read"`
	HeapHitR float64 `json:"heap_hit_ratio"`
	PKHit    int64   `json:"pkey_blocks_hit"`
	PKRead   int64   `json:"pkey_blocks_read"`
	PKHitR   float64 `json:"pkey_hit_ratio"`
	// All the table's indexes (the primary key, the partial indexes on
	// expires_at and on HTTP leases).
	IdxHit  int64   `json:"indexes_blocks_hit"`
	IdxRead int64   `json:"indexes_blocks_read"`
	IdxHitR float64 `json:"indexes_hit_ratio"`
	// WAL written over the row (pg_stat_wal: the whole server's), and per
	// key inserted; full-page images are a page's first change after a
	// checkpoint.
	WALBytes  int64   `json:"wal_bytes"`
	WALFPI    int64   `json:"wal_full_page_images"`
	WALPerKey float64 `json:"wal_bytes_per_key"`
	FPIPerKey float64 `json:"wal_full_page_images_per_key"`
	// The machine's one-minute load average when the row started.
	Load float64 `json:"load_average"`
	// Sizes after the row, bytes.
	TableBytes   int64 `json:"table_bytes"`
	IndexesBytes int64 `json:"indexes_bytes"`
	PKBytes      int64 `json:"pkey_bytes"`
	// The fill before this count's first row, seconds (0 for the rows that
	// follow it on the same count).
	FillSeconds float64 `json:"fill_seconds,omitempty"`
}

// tableSizeRun is the state of the table-size rows: the dedup table they
// share and the row being run.
type tableSizeRun struct {
	schema    string // of the dedup table
	table     string // sanitized schema.idem_dedup
	retention time.Duration
	prefilled int64
	keys      int64  // prefilled + inserted by the rows so far
	salt      string // the running row's name: its keys are its own
}

// storeConfig is the store configuration of a row whose business table is in
// schema sc: the table-size rows' shared dedup table while they run.
func (e *env) storeConfig(sc string) pgstore.Config {
	if e.ts == nil {
		return pgstore.Config{Schema: sc}
	}
	return pgstore.Config{Schema: e.ts.schema, Retention: e.ts.retention}
}

// adjustConfig gives a table-size row its keys.
func (e *env) adjustConfig(cfg *consumer.Config[pgx.Tx]) {
	if e.ts == nil || cfg.Key == nil {
		return
	}
	cfg.Key = wideKey(cfg.Key, e.ts.salt)
}

// wideKey is base's key hashed with salt, as a random key of 36 to 64
// bytes: a UUID and 0 to 28 more hex digits. A repeated message has the
// same key.
func wideKey(base consumer.KeyFunc, salt string) consumer.KeyFunc {
	return func(m *consumer.Message) (string, error) {
		k, err := base(m)
		if err != nil {
			return "", err
		}
		return wideOf(salt, k), nil
	}
}

func wideOf(salt, k string) string {
	h := sha256.Sum256([]byte(salt + "\x1f" + k))
	var x [64]byte
	hex.Encode(x[:], h[:])
	// 8-4-4-4-12 and the rest
	b := make([]byte, 0, 64)
	b = append(b, x[0:8]...)
	b = append(b, '-')
	b = append(b, x[8:12]...)
	b = append(b, '-')
	b = append(b, x[12:16]...)
	b = append(b, '-')
	b = append(b, x[16:20]...)
	b = append(b, '-')
	b = append(b, x[20:32]...)
	b = append(b, x[32:32+int(h[31])%29]...)
	return string(b)
}

// parseCounts reads -prefill: counts with optional k/M suffixes.
func parseCounts(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		mul := int64(1)
		switch {
		case strings.HasSuffix(f, "M"):
			mul, f = 1000000, strings.TrimSuffix(f, "M")
		case strings.HasSuffix(f, "k"):
			mul, f = 1000, strings.TrimSuffix(f, "k")
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("-prefill: bad count %q", f)
		}
		if len(out) > 0 && n*mul < out[len(out)-1] {
			return nil, fmt.Errorf("-prefill: counts must not decrease (%d after %d): the table only grows", n*mul, out[len(out)-1])
		}
		out = append(out, n*mul)
	}
	return out, nil
}

// countName is 0, 1M, 10M, 250k, 1234.
func countName(n int64) string {
	switch {
	case n > 0 && n%1000000 == 0:
		return strconv.FormatInt(n/1000000, 10) + "M"
	case n > 0 && n%1000 == 0:
		return strconv.FormatInt(n/1000, 10) + "k"
	}
	return strconv.FormatInt(n, 10)
}

func checkTableSize(s settings) error {
	if s.Prefill == "" {
		return nil
	}
	if _, err := parseCounts(s.Prefill); err != nil {
		return err
	}
	for _, r := range strings.Split(s.PrefillRows, ",") {
		if !slices.Contains(prefillRows, r) {
			return fmt.Errorf("-prefill-rows: unknown row %q (rows: %s)", r, strings.Join(prefillRows, ", "))
		}
	}
	if s.PrefillRetention <= 0 {
		return fmt.Errorf("-prefill-retention must be positive")
	}
	return nil
}

// benchTableSize runs the table-size rows.
func benchTableSize(ctx context.Context, e *env) ([]Row, error) {
	counts, err := parseCounts(e.s.Prefill)
	if err != nil {
		return nil, err
	}
	ts, drop, err := newTableSizeRun(ctx, e)
	if err != nil {
		return nil, err
	}
	defer func() {
		if e.s.PrefillKeep {
			fmt.Fprintf(e.log, "kept %s (-prefill-keep): DROP SCHEMA %s CASCADE when done with it\n", ts.table, ts.schema)
			return
		}
		drop()
	}()
	var rows []Row
	for _, n := range counts {
		t0 := time.Now()
		if n > ts.prefilled {
			if err := fill(ctx, e, ts, n-ts.prefilled); err != nil {
				return rows, fmt.Errorf("prefill to %d: %w", n, err)
			}
		}
		fillSecs := time.Since(t0).Seconds()
		for _, base := range strings.Split(e.s.PrefillRows, ",") {
			if n > 0 && base == "idem-b100" && e.s.PrefillControl {
				// The same row on an empty table, right before: under the
				// same load from the machine's other work.
				r, err := controlRow(ctx, e, base, base+"@0/"+countName(n))
				if err != nil {
					return rows, err
				}
				rows = append(rows, r)
			}
			r, err := tableSizeRow(ctx, e, ts, base, base+"@"+countName(n))
			if err != nil {
				return rows, err
			}
			r.Table.FillSeconds, fillSecs = fillSecs, 0
			rows = append(rows, r)
		}
	}
	return rows, nil
}

// newTableSizeRun makes a schema with a migrated, empty dedup table; drop
// drops it.
func newTableSizeRun(ctx context.Context, e *env) (*tableSizeRun, func(), error) {
	ts := &tableSizeRun{schema: fmt.Sprintf("bench_tablesize_%d", time.Now().UnixNano()), retention: e.s.PrefillRetention}
	ts.table = pgx.Identifier{ts.schema, "idem_dedup"}.Sanitize()
	if _, err := e.pool.Exec(ctx, "CREATE SCHEMA "+ts.schema); err != nil {
		return nil, nil, err
	}
	drop := func() {
		if _, err := e.pool.Exec(context.Background(), "DROP SCHEMA "+ts.schema+" CASCADE"); err != nil {
			fmt.Fprintf(e.log, "dropping %s: %v (drop it by hand: it may be large)\n", ts.schema, err)
		}
	}
	st, err := pgstore.New(e.pool, pgstore.Config{Schema: ts.schema, Retention: ts.retention})
	if err == nil {
		err = st.Migrate(ctx)
	}
	if err != nil {
		drop()
		return nil, nil, err
	}
	return ts, drop, nil
}

// controlRow runs base on an empty table of its own, dropped after.
func controlRow(ctx context.Context, e *env, base, name string) (Row, error) {
	ts, drop, err := newTableSizeRun(ctx, e)
	if err != nil {
		return Row{}, err
	}
	defer drop()
	return tableSizeRow(ctx, e, ts, base, name)
}

// tableSizeRow runs base on ts's table as the row name.
func tableSizeRow(ctx context.Context, e *env, ts *tableSizeRun, base, name string) (Row, error) {
	msgs := e.s.PrefillMessages
	if base == "idem-b1" {
		msgs = e.s.PrefillSlow
	}
	msgs = min(msgs, len(e.payloads))
	ts.salt = name
	load := loadAvg()
	fmt.Fprintf(e.log, "%s over %d messages, %d keys in the table, load %.2f...\n", name, msgs, ts.keys, load)
	before, err := statio(ctx, e, ts)
	if err != nil {
		return Row{}, err
	}
	e.ts = ts
	r, err := runRow(ctx, e, base, msgs)
	e.ts = nil
	if err != nil {
		return r, fmt.Errorf("%s: %w", name, err)
	}
	after, err := statio(ctx, e, ts)
	if err != nil {
		return r, err
	}
	r.Name = name
	t := after.minus(before)
	t.Keys, t.Prefilled, t.Load = ts.keys, ts.prefilled, load
	if r.Effects > 0 {
		t.WALPerKey, t.FPIPerKey = float64(t.WALBytes)/float64(r.Effects), float64(t.WALFPI)/float64(r.Effects)
	}
	r.Table = &t
	ts.keys += r.Effects // each new message inserted one key
	fmt.Fprintf(e.log, "  %.0f msg/s, p99 %.1f ms; heap hit %.3f (%d reads), primary key hit %.3f (%d reads); WAL %.0f bytes and %.2f full pages per key; table %s, indexes %s\n",
		r.PerSecond, r.P99Ms, t.HeapHitR, t.HeapRead, t.PKHitR, t.PKRead, t.WALPerKey, t.FPIPerKey, mib(t.TableBytes), mib(t.IndexesBytes))
	return r, nil
}

// loadAvg is the machine's one-minute load average, 0 when unknown.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _, _ := strings.Cut(string(b), " ")
	v, _ := strconv.ParseFloat(f, 64)
	return v
}

// fill adds n random keys to the table: indexes dropped, INSERT … SELECT in
// chunks, indexes rebuilt, VACUUM (ANALYZE).
func fill(ctx context.Context, e *env, ts *tableSizeRun, n int64) error {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	c := conn.Conn()
	// The index builds sort in memory as far as they can.
	if _, err := c.Exec(ctx, "SET maintenance_work_mem = '1GB'"); err != nil {
		return err
	}
	type index struct{ name, def, constraint, condef string }
	var idx []index
	rs, err := c.Query(ctx, `SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid), coalesce(c.conname, ''), coalesce(pg_get_constraintdef(c.oid), '')
FROM pg_index i LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid
WHERE i.indrelid = $1::regclass ORDER BY 1`, ts.table)
	if err != nil {
		return err
	}
	for rs.Next() {
		var x index
		if err := rs.Scan(&x.name, &x.def, &x.constraint, &x.condef); err != nil {
			rs.Close()
			return err
		}
		idx = append(idx, x)
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return err
	}
	t0 := time.Now()
	for _, x := range idx {
		q := "DROP INDEX " + x.name
		if x.constraint != "" {
			q = "ALTER TABLE " + ts.table + " DROP CONSTRAINT " + pgx.Identifier{x.constraint}.Sanitize()
		}
		if _, err := c.Exec(ctx, q); err != nil {
			return err
		}
	}
	const chunk = 1000000
	retMs := ts.retention.Milliseconds()
	// expires_at uniform over (now, now + retention]: keys created over the
	// last retention window, none expired. created_at = expires_at - retention.
	q := `INSERT INTO ` + ts.table + ` (scope, key, fingerprint, source, outcome, created_at, expires_at)
SELECT 'bench', left(gen_random_uuid()::text || md5(g::text), 36 + (random() * 28)::int), sha256(int8send(g)),
       'idem-bench-prefill/' || (g % 8) || '@' || g, 'done', x - $3::bigint * interval '1 millisecond', x
FROM generate_series($1::bigint, $2::bigint) g,
     LATERAL (SELECT now() + (1 + random() * ($3::bigint - 1)) * interval '1 millisecond' + g * interval '0') AS ex(x)`
	for from := ts.prefilled + 1; from <= ts.prefilled+n; from += chunk {
		to := min(from+chunk-1, ts.prefilled+n)
		if _, err := c.Exec(ctx, q, from, to, retMs); err != nil {
			return err
		}
		fmt.Fprintf(e.log, "  prefill: %d of %d keys, %.0f s\n", to-ts.prefilled, n, time.Since(t0).Seconds())
	}
	ins := time.Since(t0)
	for _, x := range idx {
		q := x.def
		if x.constraint != "" {
			q = "ALTER TABLE " + ts.table + " ADD CONSTRAINT " + pgx.Identifier{x.constraint}.Sanitize() + " " + x.condef
		}
		if _, err := c.Exec(ctx, q); err != nil {
			return err
		}
	}
	built := time.Since(t0) - ins
	if _, err := c.Exec(ctx, "VACUUM (ANALYZE) "+ts.table); err != nil {
		return err
	}
	if e.s.PrefillPrewarm {
		// CREATE INDEX writes the index around shared_buffers, and VACUUM
		// reads the heap through a small ring: without this the rows would
		// start on cold buffers. The heap's inserts go to its last pages.
		if _, err := c.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_prewarm`); err != nil {
			return err
		}
		if _, err := c.Exec(ctx, `SELECT pg_prewarm(conindid) FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'p'`, ts.table); err != nil {
			return err
		}
	}
	// The WAL of the fill out of the way before the rows: a checkpoint
	// flushes it and the dirty pages now, not during the first row.
	if _, err := c.Exec(ctx, "CHECKPOINT"); err != nil {
		return err
	}
	ts.prefilled += n
	ts.keys += n
	fmt.Fprintf(e.log, "  prefilled %d keys (%d in all): insert %.0f s, indexes %.0f s, vacuum, prewarm and checkpoint %.0f s\n",
		n, ts.prefilled, ins.Seconds(), built.Seconds(), (time.Since(t0) - ins - built).Seconds())
	return nil
}

// statio is the table's block counters and sizes, every pool connection's
// statistics flushed first.
func statio(ctx context.Context, e *env, ts *tableSizeRun) (tableStats, error) {
	// A backend flushes its counters when it goes idle, at most once a
	// second unless told to; pg_stat_force_next_flush tells it.
	for _, c := range e.pool.AcquireAllIdle(ctx) {
		_, err := c.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		c.Release()
		if err != nil {
			return tableStats{}, err
		}
	}
	var t tableStats
	err := e.pool.QueryRow(ctx, `SELECT coalesce(s.heap_blks_hit, 0), coalesce(s.heap_blks_read, 0),
    coalesce(i.idx_blks_hit, 0), coalesce(i.idx_blks_read, 0), coalesce(s.idx_blks_hit, 0), coalesce(s.idx_blks_read, 0),
    pg_relation_size(s.relid), pg_indexes_size(s.relid), pg_relation_size(i.indexrelid)
FROM pg_statio_user_tables s
JOIN pg_constraint c ON c.conrelid = s.relid AND c.contype = 'p'
JOIN pg_statio_user_indexes i ON i.indexrelid = c.conindid
WHERE s.relid = $1::regclass`, ts.table).Scan(&t.HeapHit, &t.HeapRead, &t.PKHit, &t.PKRead, &t.IdxHit, &t.IdxRead,
		&t.TableBytes, &t.IndexesBytes, &t.PKBytes)
	if err != nil {
		return t, err
	}
	var walBytes float64
	err = e.pool.QueryRow(ctx, `SELECT wal_fpi, wal_bytes FROM pg_stat_wal`).Scan(&t.WALFPI, &walBytes)
	t.WALBytes = int64(walBytes)
	return t, err
}

// minus is the counters' change since b, with the hit ratios; the sizes are
// t's.
func (t tableStats) minus(b tableStats) tableStats {
	d := t
	d.HeapHit, d.HeapRead = t.HeapHit-b.HeapHit, t.HeapRead-b.HeapRead
	d.PKHit, d.PKRead = t.PKHit-b.PKHit, t.PKRead-b.PKRead
	d.IdxHit, d.IdxRead = t.IdxHit-b.IdxHit, t.IdxRead-b.IdxRead
	d.WALBytes, d.WALFPI = t.WALBytes-b.WALBytes, t.WALFPI-b.WALFPI
	d.HeapHitR, d.PKHitR, d.IdxHitR = hitRatio(d.HeapHit, d.HeapRead), hitRatio(d.PKHit, d.PKRead), hitRatio(d.IdxHit, d.IdxRead)
	return d
}

func hitRatio(hit, read int64) float64 {
	if hit+read == 0 {
		return 1
	}
	return float64(hit) / float64(hit+read)
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// tableSizeRatios compares each table-size row with the same row on the
// emptiest table; idem-b100 at 10M and more has issue 29's target, 70%.
func tableSizeRatios(rows []Row) []ratio {
	var out []ratio
	base, control := map[string]Row{}, map[string]Row{}
	for _, r := range rows {
		if r.Table == nil {
			continue
		}
		name, count, _ := strings.Cut(r.Name, "@")
		if strings.Contains(count, "/") {
			control[count[strings.Index(count, "/")+1:]] = r // idem-b100@0/10M
			continue
		}
		b, ok := base[name]
		if !ok {
			base[name] = r
			continue
		}
		add := func(b Row) {
			if b.PerSecond == 0 {
				return
			}
			x := ratio{Name: r.Name + "/" + b.Name, Value: r.PerSecond / b.PerSecond}
			if name == "idem-b100" && r.Table.Prefilled >= 10000000 {
				met := x.Value >= 0.7
				x.Target, x.Met = ">= 0.70", &met
			}
			out = append(out, x)
		}
		add(b)
		if c, ok := control[count]; ok && name == "idem-b100" {
			add(c)
		}
	}
	return out
}

// printTableSize prints the table-size rows' view of the dedup table.
func printTableSize(w io.Writer, s settings, rows []Row) {
	if !slices.ContainsFunc(rows, func(r Row) bool { return r.Table != nil }) {
		return
	}
	fmt.Fprintf(w, "\ntable-size rows: shared_buffers %s, Retention %v; random keys of 36-64 bytes; buffer hits over each row\n\n", s.SharedBuffers, s.PrefillRetention)
	fmt.Fprintf(w, "| row | keys | load | msg/s | p99 ms | heap hit | heap reads | pkey hit | pkey reads | all indexes hit | WAL B/key | FPI/key | table MiB | indexes MiB | pkey MiB | fill s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		t := r.Table
		if t == nil {
			continue
		}
		fmt.Fprintf(w, "| %s | %d | %.1f | %.0f | %.2f | %.4f | %d | %.4f | %d | %.4f | %.0f | %.2f | %.0f | %.0f | %.0f | %.0f |\n", r.Name, t.Keys, t.Load, r.PerSecond, r.P99Ms,
			t.HeapHitR, t.HeapRead, t.PKHitR, t.PKRead, t.IdxHitR, t.WALPerKey, t.FPIPerKey,
			float64(t.TableBytes)/(1<<20), float64(t.IndexesBytes)/(1<<20), float64(t.PKBytes)/(1<<20), t.FillSeconds)
	}
}
