// Package readmetest compiles the Go code blocks of the module's README.md
// and of every docs/*.md, so that a snippet cannot rot while the API moves,
// and checks the pages' relative links. It has no code of its own: the
// tests are the package.
//
// The convention for a ```go block in README.md or a page of docs/:
//
//   - A block that starts with a package clause is a whole file. It is built
//     as a package of its own, as written.
//   - Any other block is a fragment: statements of a function body. It is
//     compiled inside func _() { ... }, with these in scope and nothing else:
//     ctx (a context.Context), pool (a *pgxpool.Pool), brokers (a []string of
//     Kafka seed brokers); store (a *pgstore.Store), src (a source.Source)
//     and dlq (a consumer.DeadLetter), as the README's handler builds them;
//     and the imports listed in fragmentImports — the standard library
//     packages a handler uses, pgx, and idem's own packages under their last
//     path element (consumer, consumertest, otelconsumer, dedup, memstore,
//     pgstore, sqlitestore, kafka, rocketmq, outbox, kafkapub, rocketmqpub).
//     A fragment declares everything else it uses and checks its errors, as
//     code a user copies should.
//   - A block whose first line is "// readme: not compiled: <reason>" is left
//     out; the reason is required.
//
// Every compiled block must be gofmt-clean and pass go build and go vet, and
// may not drop an error. Errors point at the page's own lines (//line
// directives), as README.md:80 or docs/keys.md:40.
//
// TestDocLinks checks that every relative link of README.md, CHANGELOG.md
// and docs/*.md leads to a file of the repository, and a #fragment to a
// heading of its page (GitHub's anchors), and that README.md links every
// page of docs/.
package readmetest
