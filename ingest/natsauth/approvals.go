package natsauth

import "github.com/talos-audit/talos/schemas"

// controlAuditConsumer is the control services' durable consumer on
// TALOS_CONTROL (ingest/control.ControlAuditConsumer), which enforcement
// points must not read, change or delete.
const controlAuditConsumer = "talos-control-audit"

// approvalAPI is the JetStream API an enforcement point's approval
// follower (ep.Approvals) needs, and nothing else: the info of
// TALOS_CONTROL (where it ends), ordered consumers on it filtered on
// exactly the approve or the reject subject (the filter is part of the
// create subject, and nats-server refuses a config whose filter differs
// from it), pulling from and deleting its own consumers, whose names are
// random. The control services' durable is denied by name. Everything else
// stays denied: publishing to TALOS_CONTROL, the API of other streams,
// other filters, direct and message gets, listing consumers.
//
// A consumer's creator chooses its config; nats-server does not check a
// push consumer's deliver subject against the creator's permissions, so an
// enforcement point could have approve and reject events (already signed
// and public to every enforcement point) delivered to a subject of its
// choosing. DESIGN.md §3 "NATS users and permissions" says so.
func approvalAPI() (allow, deny []string) {
	const api = "$JS.API."
	stream := schemas.StreamControl
	allow = []string{api + "STREAM.INFO." + stream}
	for _, verb := range []string{schemas.VerbApprove, schemas.VerbReject} {
		allow = append(allow, api+"CONSUMER.CREATE."+stream+".*."+schemas.ControlSubject(verb))
	}
	allow = append(allow, api+"CONSUMER.MSG.NEXT."+stream+".*", api+"CONSUMER.DELETE."+stream+".*")
	deny = []string{
		api + "CONSUMER.CREATE." + stream + "." + controlAuditConsumer + ".>",
		api + "CONSUMER.MSG.NEXT." + stream + "." + controlAuditConsumer,
		api + "CONSUMER.DELETE." + stream + "." + controlAuditConsumer,
	}
	return allow, deny
}
