// Package wire is the format of what idem writes to a broker besides the
// user's own messages: the headers (Kafka) or user properties (RocketMQ)
// of a dead letter and of a retry copy, how their values are written, and
// the causes a dead letter names.
//
// Both adapters write letters and retry copies with it, the consumer reads
// a copy's lineage with it, and `idem redrive`, `idem failed` and any tool
// of yours that reads a dead-letter topic read them with it. The header
// names and value forms are a stable format: a letter written by one
// version of idem is read by the next.
package wire
