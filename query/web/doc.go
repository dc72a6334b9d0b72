// Package web is the auditors' read-only dashboard (talosd role web): an
// overview with charts, a searchable receipt list, a receipt page with the
// exact signed JSON and its verification status, and the incident
// timeline.
//
// It only reads ClickHouse, through the canned queries of package query
// and its parameterized receipt search: no SQL text from the browser ever
// reaches ClickHouse, and every query parameter is parsed and validated
// first. Every request but /healthz and the stylesheet needs the access
// token (a bearer header, or the cookie set by visiting /?token=…). Pages
// are html/template output with server-side SVG charts and one embedded
// stylesheet: no script, no CDN, so it works offline under a strict
// Content-Security-Policy. LoadOrCreateToken keeps the token in a file
// (mode 0600), and Serve runs the handler with timeouts fitted to its
// queries.
//
// Every figure a page shows carries a stable data-figure attribute whose
// element's text is the figure, e.g. <span data-figure="total-calls">42</span>,
// so tests and scrapers read numbers from the DOM without parsing layout.
package web
