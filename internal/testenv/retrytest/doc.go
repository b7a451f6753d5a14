// Package retrytest holds what the adapters' tests of non-blocking retries
// (consumer.NonBlocking) share: a store whose COMMIT outcome gets lost, a
// watch for retry copies handled before they were due, and the checks of
// key-ordered retries.
package retrytest
