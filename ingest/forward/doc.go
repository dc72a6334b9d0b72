// Package forward is talosd's forward role (DESIGN.md §4, SIEM
// forwarding): it sends every signed record of TALOS_AUDIT — decision,
// effect and control receipts, ToolCallEvents, checkpoints — to SIEM
// destinations: syslog (RFC 5424 over TCP with octet-counting framing, or
// TLS per RFC 5425), a Splunk HTTP Event Collector, or a webhook taking a
// JSON array of events. Each message carries the stored CloudEvent byte
// for byte, so what lands in the SIEM verifies with the signers' public
// keys, beside the few fields SIEMs index (time, agent, tool, decision,
// reason codes, receipt id, event id).
//
// Delivery is at least once. Each destination reads its own durable
// consumer (talos-forward-<name>), so one that is slow or down holds back
// no other and never the decisions: the enforce workers do not wait for
// it. A fetched batch is acked only after the destination accepted it: a
// 2xx answer over HTTP; over syslog, a flushed write on a connection that
// was still open ConfirmAfter later (a batch written on a connection that
// failed before is written again on the next). A failed delivery is
// retried with back-off for as long as it takes, its messages kept in
// progress; an outage longer than AlertAfter is logged at error level and
// published on talos.status.alert.forward.<name>. After a restart the
// consumer resumes from its cursor. Every message carries the event id, so
// a duplicate is recognisable.
//
// Shutdown: cancel the context given to Run; Run returns once every
// destination has stopped and acked what was confirmed. Close the NATS
// connection after that.
package forward
