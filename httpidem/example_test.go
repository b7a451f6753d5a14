package httpidem_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/httpidem"
)

// A transactional route: the handler's INSERT, the key and the response
// commit together; a retry gets the stored response, a reused key with
// another body 422, a request without a key 400.
func Example() {
	dir, err := os.MkdirTemp("", "httpidem")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlitestore.Open(filepath.Join(dir, "shop.db"), sqlitestore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlitestore.New(db, sqlitestore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE payments (key TEXT, amount INTEGER)`); err != nil {
		log.Fatal(err)
	}

	idem, err := httpidem.New(httpidem.Config[*sql.Tx]{Store: store})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.Transactional(httpidem.Route{}, httpidem.TxHandlerFunc[*sql.Tx](
		func(w http.ResponseWriter, r *http.Request, tx *sql.Tx) error {
			key, _ := httpidem.KeyFrom(r.Context()) // decoded: "order-42" and order-42 are one key
			if _, err := tx.ExecContext(r.Context(), `INSERT INTO payments VALUES (?, 100)`, key); err != nil {
				return err // rolled back, nothing stored: a retry runs again
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, err := fmt.Fprint(w, `{"status":"paid"}`)
			return err
		})))

	send := func(key, body string) {
		r := httptest.NewRequest("POST", "/payments", strings.NewReader(body))
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		var problem struct{ Title string }
		if w.Header().Get("Content-Type") == "application/problem+json" {
			_ = json.Unmarshal(w.Body.Bytes(), &problem)
			fmt.Println(w.Code, problem.Title)
			return
		}
		fmt.Println(w.Code, w.Body, "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	send("order-42", `{"amount":100}`)
	send("order-42", `{ "amount": 100 }`) // the same request, spelled otherwise
	send("order-42", `{"amount":200}`)
	send("", `{"amount":100}`)

	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM payments`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println(n, "payment")
	// Output:
	// 201 {"status":"paid"} replayed: false
	// 201 {"status":"paid"} replayed: true
	// 422 Idempotency-Key is already used
	// 400 Idempotency-Key is missing
	// 1 payment
}
