// Package jsonkit is the project's one JSON toolkit, a leaf that imports no
// other project package:
//
//   - RFC 8785 (JCS) canonical JSON: Canonicalize, MarshalCanonical (one
//     pass from Go values), CanonicalTree (from a decoded tree),
//     AppendString, and AppendCanonicalObject, which also finds where a
//     member goes, so a signer inserts data.signature without encoding
//     again (DESIGN.md §3);
//   - walkers of canonical bytes by offset: SkipString, SkipValue,
//     FindMember, RemoveMember, and the canonical-form check
//     IsCanonicalObject / CanonicalMembers;
//   - the string primitives every one-pass reader of the project builds on:
//     the word-at-a-time byte tests (PlainWord, QuoteWord, PlainRun,
//     QuoteRun), Hex4, DecodeEscape, ScanString, Unescape and NumberEnd,
//     over bytes or strings alike;
//   - RFC 6901 JSON pointers: ValidPointer, ParsePointer, EscapeToken,
//     JoinPointer, ResolvePointer, ArrayIndex.
//
// The specialised readers (the envelope and decision parsers in schemas,
// the signed-event reader in receipts/verify, the row builders in query)
// stay with their packages and use these primitives.
package jsonkit
