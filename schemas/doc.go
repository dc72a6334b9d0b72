// Package schemas is the wire contract of Talos: the JSON Schemas (draft
// 2020-12, embedded from this folder), the Go structs that mirror them, the
// stream and subject names, the CloudEvent type names and the stable reason
// codes. It is the leaf of the module and imports no other Talos package.
//
// Other programs script against every name in this package; change one only
// where DESIGN.md says so.
package schemas
