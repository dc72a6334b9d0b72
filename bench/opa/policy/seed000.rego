# The registry rules (REG 9.2) that Talos's enforce.Engine applies to a phase-pre
# tool call, written as a Rego policy so that OPA's cost for the same
# decision can be measured. Input is the tool call envelope; data.talos
# holds the pinned registry:
#
#   data.talos.mode   "prod" or "dev"
#   data.talos.digest the pinned registry digest ("sha256:<hex>")
#   data.talos.tools  {<server_id>: {<tool_name>: <registry tool entry>}}
#
# The result is {"decision": "allow"|"deny", "reason_codes": [...]}, with
# the engine's reason codes. Not covered (other requirements): the request hash,
# capability signatures, trust metadata, subagent access, action-based
# tools.
package talos.seed000

tool := data.talos.tools[input.server_id][input.tool_name]

class := tool.tool_class

# Deny by default: a tool the registry does not classify.
reasons contains "TOOL_UNCLASSIFIED_DENIED" if {
	not tool
	data.talos.mode != "dev"
}

reasons contains "UNKNOWN_TOOL" if {
	not tool
	data.talos.mode != "dev"
}

reasons contains "TOOL_UNCLASSIFIED_ALLOWED_DEV" if {
	not tool
	data.talos.mode == "dev"
}

# Registry parity: the enforcement point enforced with the same registry.
reasons contains "REGISTRY_VERSION_MISMATCH" if {
	input.registry_digest != data.talos.digest
}

# The agent's declared class is informational; a mismatch is denied.
reasons contains "TOOL_CLASS_DECLARATION_MISMATCH" if {
	input.tool_class != class
}

# A read-only capability anywhere in the chain may not call a write tool.
reasons contains "TOOL_CLASS_MISMATCH" if {
	class == "write"
	some value
	walk(input.capability, [_, value])
	value.constraints.read_only == true
}

reasons contains "IDEMPOTENCY_KEY_REQUIRED" if {
	class == "write"
	not input.idempotency_key
}

# Document rules of a write document operation.
spec := tool.document_spec if {
	class == "write"
	tool.is_document_op == true
	count(tool.document_spec.write_content_pointers) > 0
}

max_write := object.get(spec, "max_write_bytes", 5242880)

max_batch := object.get(spec, "max_batch_bytes", 52428800)

default applied := set()

applied := {p | some p in spec.write_content_pointers}

content[p] := v if {
	some p in applied
	v := resolve(input.request.arguments, p)
	is_string(v)
}

documents[p] := doc if {
	some p, s in content
	doc := decode(s, spec.content_encoding)
}

reasons contains "DOC_CONTENT_POINTER_INVALID" if {
	some p in applied
	not content[p]
}

reasons contains "DOC_ENCODING_INVALID" if {
	some p, _ in content
	not documents[p]
}

reasons contains "DOC_SIZE_EXCEEDED" if {
	some doc in documents
	doc.size > max_write
}

reasons contains "DOC_SIZE_EXCEEDED" if {
	sum([doc.size | some doc in documents]) > max_batch
}

# Expected hashes of a classified tool: each names an applied pointer and,
# if that document was read, its hash.
reasons contains "DOC_HASH_MISMATCH" if {
	tool
	some x in input.expected_document_hashes
	not applied[x.pointer]
}

reasons contains "DOC_HASH_MISMATCH" if {
	tool
	some x in input.expected_document_hashes
	documents[x.pointer].hash != x.hash
}

warnings := {"TOOL_UNCLASSIFIED_ALLOWED_DEV"}

default decision := "allow"

decision := "deny" if {
	some r in reasons
	not warnings[r]
}

result := {"decision": decision, "reason_codes": sort([r | some r in reasons])}

# decode is a document's preimage size and hash: the UTF-8 bytes of the
# string, or its canonical padded standard base64 decoding.
decode(s, "utf8") := {"size": byte_length(s), "hash": crypto.sha256(s)}

decode(s, "base64") := {"size": decoded_length(s), "hash": crypto.sha256(b)} if {
	not contains(s, "\n")
	not contains(s, "\r")
	base64.is_valid(s)
	b := base64.decode(s)
	base64.encode(b) == s
}

# byte_length counts a string's UTF-8 bytes (count counts code points).
byte_length(s) := decoded_length(base64.encode(s))

decoded_length(b64) := ((count(b64) / 4) * 3) - padding(b64)

padding(b64) := 2 if endswith(b64, "==")

padding(b64) := 1 if {
	endswith(b64, "=")
	not endswith(b64, "==")
}

padding(b64) := 0 if not endswith(b64, "=")

# resolve evaluates an RFC 6901 pointer of up to six tokens in a JSON
# document; array tokens are canonical indexes.
resolve(root, p) := walk_tokens(root, tokens(p))

walk_tokens(root, t) := step(root, t[0]) if count(t) == 1

walk_tokens(root, t) := step(step(root, t[0]), t[1]) if count(t) == 2

walk_tokens(root, t) := step(step(step(root, t[0]), t[1]), t[2]) if count(t) == 3

walk_tokens(root, t) := step(step(step(step(root, t[0]), t[1]), t[2]), t[3]) if count(t) == 4

walk_tokens(root, t) := step(step(step(step(step(root, t[0]), t[1]), t[2]), t[3]), t[4]) if count(t) == 5

walk_tokens(root, t) := step(step(step(step(step(step(root, t[0]), t[1]), t[2]), t[3]), t[4]), t[5]) if count(t) == 6

tokens(p) := [unescape(t) | some t in split(substring(p, 1, -1), "/")] if startswith(p, "/")

unescape(t) := replace(replace(t, "~1", "/"), "~0", "~")

step(node, t) := node[t] if is_object(node)

step(node, t) := node[to_number(t)] if {
	is_array(node)
	regex.match(`^(0|[1-9][0-9]{0,8})$`, t)
}
