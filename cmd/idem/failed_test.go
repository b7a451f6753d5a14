package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/otelconsumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// TestFailedAgreesWithTheMetrics: three payments fail for good, then two of
// them are re-sent three times. `idem failed` lists three keys, each with
// the cause permanent, the consumer's metrics count three permanent dead
// letters and three failed_before (the re-sends, counted apart), and the
// letters' idem-cause headers say the same: a re-send is not a new
// incident anywhere.
func TestFailedAgreesWithTheMetrics(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ctx := testenv.Context(t, 2*time.Minute)
	store := pgtest.Store(t, pool, schema)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background()) //nolint:errcheck
	tel, err := otelconsumer.New(otelconsumer.Config{MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*consumer.Message
	for i, id := range []string{"P1", "A1", "P2", "P3", "P1", "P2", "P1"} {
		msgs = append(msgs, consumertest.Message("pay", 0, int64(i), "", fmt.Sprintf(`{"txn_id":%q}`, id)))
	}
	res := consumertest.Run(t, consumer.Config[pgx.Tx]{
		Name: "payments", Store: store, Observer: tel, Logger: testenv.Logger(t), Key: consumer.ByJSONField("txn_id"),
		Handler: consumer.HandlerFunc[pgx.Tx](func(_ context.Context, _ pgx.Tx, m *consumer.Message) error {
			if id, _ := consumer.ByJSONField("txn_id")(m); strings.HasPrefix(id, "P") {
				return consumer.Permanent(errors.New("account closed"))
			}
			return nil
		}),
	}, consumertest.Script{}, msgs...)

	envs := map[string]string{"IDEM_PG_URL": testenv.PostgresURL(t), "IDEM_PG_SCHEMA": schema}
	code, out, _ := idem(t, "", envs, "failed", "--json", "--scope", "payments")
	rows := decode[[]rowJSON](t, out)
	if code != exitOK || len(rows) != 3 {
		t.Fatalf("idem failed: %d %+v", code, rows)
	}
	for _, r := range rows {
		if r.Cause != "permanent" || !strings.HasPrefix(r.Source, "pay/0/") {
			t.Errorf("row %s: cause %q, source %q", r.Key, r.Cause, r.Source)
		}
	}
	if code, out, _ := idem(t, "", envs, "failed"); code != exitOK || !strings.Contains(out, "3 failed keys, one incident each") ||
		!strings.Contains(out, "failed_before") {
		t.Errorf("idem failed: %d %q", code, out)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	metric := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "idem.consumer.dead_letters" {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				v, _ := p.Attributes.Value(attribute.Key("idem.dead_letter.cause"))
				metric[v.AsString()] += p.Value
			}
		}
	}
	letters := map[string]int64{}
	for _, l := range res.DeadLetters {
		hs, _ := wire.Letter(l).Record(1 << 20)
		for _, h := range hs {
			if h.Key == wire.MetaCause {
				letters[string(h.Value)]++
			}
		}
	}
	want := map[string]int64{"permanent": int64(len(rows)), "failed_before": 3}
	for cause, n := range want {
		if metric[cause] != n || letters[cause] != n {
			t.Errorf("%s: %d in the metrics, %d letters; want %d", cause, metric[cause], letters[cause], n)
		}
	}
	if len(res.DeadLetters) != 6 || len(letters) != len(want) {
		t.Errorf("letters by cause %v, %d in all", letters, len(res.DeadLetters))
	}
}
