package web

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"regexp"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static/style.css
var styleCSS []byte

// ErrPending is what an Options.Inclusion error wraps when no checkpoint
// covers the receipt yet (its chain has not cut the next one).
var ErrPending = errors.New("not yet covered by a checkpoint")

// Options configure the dashboard. Conn, Database and Token are required;
// the zero value of the others means: no trusted keys (every signature
// shows as an unknown key), no checkpoint check, slog.Default, time.Now.
type Options struct {
	Conn     driver.Conn   // ClickHouse, read only
	Database string        // the Talos database
	Keys     verify.KeySet // trusted signers, for the receipt page's verification status
	// Token is the access token every request but /healthz must present.
	// 16 to 256 characters from [A-Za-z0-9._~+/=-] (it travels in a
	// header, a URL and a cookie).
	Token string
	// Inclusion, if set, says whether a verified checkpoint covers a
	// receipt; ok=false with a detail shows as a problem, an error
	// wrapping ErrPending as "pending" (no checkpoint covers it yet: not a
	// problem), any other error as "error". Nil shows "not checked".
	Inclusion func(ctx context.Context, receiptID string) (ok bool, detail string, err error)
	// Forwarding, if set, lists the forward role's SIEM destinations and
	// their state for the incidents page; nil: the page shows no panel.
	Forwarding func(ctx context.Context) ([]schemas.ForwardStatus, error)
	Logger     *slog.Logger
	Now        func() time.Time
}

// ErrBadToken is returned by NewHandler for a missing or unusable token.
var ErrBadToken = errors.New("web: the token must be 16 to 256 characters from [A-Za-z0-9._~+/=-]")

var tokenPattern = regexp.MustCompile(`^[A-Za-z0-9._~+/=-]{16,256}$`)

// ValidToken reports whether s is usable as Options.Token.
func ValidToken(s string) bool { return tokenPattern.MatchString(s) }

// QueryTimeout bounds the ClickHouse work of one page.
const QueryTimeout = 30 * time.Second

type handler struct {
	o     Options
	token tokenCheck
	pages map[string]*template.Template
	mux   *http.ServeMux
}

// NewHandler returns the dashboard: GET only, token-protected (except
// /healthz and /static/style.css), with security headers on every
// response.
func NewHandler(o Options) (http.Handler, error) {
	if o.Conn == nil {
		return nil, errors.New("web: Options.Conn is required")
	}
	if !query.ValidName(o.Database) {
		return nil, fmt.Errorf("web: invalid database name %q", o.Database)
	}
	if !ValidToken(o.Token) {
		return nil, ErrBadToken
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Keys == nil {
		o.Keys = verify.KeySet{}
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	h := &handler{o: o, token: newTokenCheck(o.Token), pages: pages, mux: http.NewServeMux()}
	h.mux.HandleFunc("/{$}", h.overview)
	h.mux.HandleFunc("/receipts", h.receiptList)
	h.mux.HandleFunc("/receipts/{id}", h.receipt)
	h.mux.HandleFunc("/incidents", h.incidents)
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, http.StatusNotFound, "There is no page at this address.", nil)
	})
	return h, nil
}

// pageNames are the templates that extend layout.html.
var pageNames = []string{"overview", "receipts", "receipt", "incidents", "error"}

func parsePages() (map[string]*template.Template, error) {
	sub, err := fs.Sub(templateFS, "templates")
	if err != nil {
		return nil, err
	}
	base, err := template.New("layout.html").Funcs(funcs).ParseFS(sub, "layout.html")
	if err != nil {
		return nil, fmt.Errorf("web: templates: %w", err)
	}
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.Must(base.Clone()).ParseFS(sub, name+".html")
		if err != nil {
			return nil, fmt.Errorf("web: template %s: %w", name, err)
		}
		pages[name] = t
	}
	u, err := template.New("unauthorized.html").Funcs(funcs).ParseFS(sub, "unauthorized.html")
	if err != nil {
		return nil, fmt.Errorf("web: template unauthorized: %w", err)
	}
	pages["unauthorized"] = u
	return pages, nil
}

// securityHeaders are set on every response. Styles come from the served
// stylesheet only and there is no script at all.
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'self'; script-src 'none'; style-src 'self'; img-src 'self' data:; " +
		"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
	"X-Content-Type-Options": "nosniff",
	"X-Frame-Options":        "DENY",
	"Referrer-Policy":        "no-referrer",
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	for k, v := range securityHeaders {
		w.Header().Set(k, v)
	}
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, "method not allowed: the dashboard is read-only (GET)", http.StatusMethodNotAllowed)
		return
	}
	switch r.URL.Path {
	case "/healthz":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
		return
	case "/static/style.css":
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		w.Header().Set("Cache-Control", "public, max-age=3600")
		_, _ = w.Write(styleCSS)
		return
	}
	if !h.authorize(w, r) {
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	h.mux.ServeHTTP(w, r)
}

// page is what every page template gets.
type page struct {
	Title     string
	Nav       string // which nav entry is current
	Database  string
	Generated string
	Data      any
}

func (h *handler) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data any) {
	t := h.pages[name]
	p := page{Title: title, Nav: name, Database: h.o.Database, Generated: fmtTime(h.o.Now()), Data: data}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := t.ExecuteTemplate(w, "layout.html", p); err != nil {
		h.o.Logger.Error("render page", "page", name, "path", r.URL.Path, "err", err)
	}
}

// failure is the data of the error page.
type failure struct {
	Status  int
	Message string
	Detail  string
}

// fail shows an error page. err (a query error) is logged and shown: it
// names columns and filter values, never the token.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, status int, msg string, err error) {
	f := failure{Status: status, Message: msg}
	if err != nil {
		f.Detail = err.Error()
		h.o.Logger.Warn("dashboard request failed", "path", r.URL.Path, "status", status, "err", err)
	}
	h.render(w, r, status, "error", http.StatusText(status), f)
}

// queryContext bounds the ClickHouse work of one request.
func queryContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), QueryTimeout)
}
