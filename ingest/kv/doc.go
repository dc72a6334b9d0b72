// Package kv keeps the state that every worker shares in JetStream KV
// buckets: the call ledger (Ledger on TALOS_LEDGER: replay claims, the pre
// decisions of calls and of calls parked for approval, idempotency keys;
// enforce.CallLedger) and the rate-limit counters (KVRateStore on
// TALOS_RATE, enforce.RateStore, and NewRateLimiter over it). Every bucket
// is created or updated by one constructor, so all of them honour the
// replica count and storage type they are given, and an update never
// lowers an existing bucket's replicas.
package kv
