// Package checkpoint cuts the signed checkpoints of a hash chain and stores
// them in TALOS_AUDIT: Options says when a chain is due (after Every
// receipts or once its oldest uncovered receipt is Interval old, and always
// when it stops), and Publisher signs the chain's pending range and
// publishes it, retrying until JetStream has it. The enforce worker's
// chains and the control service's chain both use it.
package checkpoint
