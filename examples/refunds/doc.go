// Package refunds is a refund consumer a payments team would copy: refund
// requests from Kafka, each executed once by an Alipay-like refund API and
// booked once in Postgres, however often the request is re-sent or
// redelivered and wherever the consumer dies.
//
// A request names a refund of a captured payment:
//
//	{"refund_id":"rf-1001","trade_no":"2026120722001","amount":1299}
//
// The dedup key is refund_id. The call to the channel is one step of the
// effect journal (package effect): its out_request_no is derived from the
// key and the step's name, so every delivery, retry copy and redrive sends
// the same one; the intent is committed before the request leaves; a
// timeout or a 5xx leaves the step unknown and the next delivery asks the
// channel's refund query before it repeats anything; the lease's fencing
// token goes with the request. The refund's row then commits with the
// dedup row. A refusal (the amount exceeds the payment) is booked as
// refused; a refund whose outcome the channel can no longer tell is
// dead-lettered with cause in_doubt for the operators.
//
// Channel speaks the refund API of the test environment's provider
// simulator (internal/testenv/provider); put a real channel's signing and
// fields in its two methods.
package refunds
