package query

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// Output formats of WriteResult: how `talosctl query` prints a canned
// query's rows.
const (
	FormatTable = "table" // aligned columns for a person, with a row count
	FormatCSV   = "csv"   // RFC 4180, a header row, exact values
	FormatJSON  = "json"  // one array of objects, keys in column order
)

// WriteResult writes res to w as FormatTable (the default for any other
// format), FormatCSV or FormatJSON. Times are RFC 3339 in UTC with
// milliseconds and a "day" column is a date. limit is the row limit the
// query ran with: a table whose row count reaches it says there may be
// more.
func WriteResult(w io.Writer, format string, res *Result, limit int) error {
	switch format {
	case FormatJSON:
		return writeResultJSON(w, res)
	case FormatCSV:
		cw := csv.NewWriter(w)
		if err := cw.Write(res.Columns); err != nil {
			return err
		}
		for _, row := range res.Rows {
			rec := make([]string, len(row))
			for j, v := range row {
				rec[j] = CellText(res.Columns[j], v, false)
			}
			if err := cw.Write(rec); err != nil {
				return err
			}
		}
		cw.Flush()
		return cw.Error()
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.ToUpper(strings.Join(res.Columns, "\t")))
	for _, row := range res.Rows {
		cells := make([]string, len(row))
		for j, v := range row {
			cells[j] = CellText(res.Columns[j], v, true)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	more := ""
	if len(res.Rows) == limit {
		more = fmt.Sprintf(" (the --limit of %d: there may be more)", limit)
	}
	_, err := fmt.Fprintf(w, "%d row(s)%s\n", len(res.Rows), more)
	return err
}

// writeResultJSON writes res as one JSON array of objects whose keys are
// in column order (a map would sort them).
func writeResultJSON(w io.Writer, res *Result) error {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, row := range res.Rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('{')
		for j, col := range res.Columns {
			if j > 0 {
				b.WriteByte(',')
			}
			k, _ := json.Marshal(col)
			v, err := json.Marshal(jsonValue(col, row[j]))
			if err != nil {
				return err
			}
			b.Write(k)
			b.WriteByte(':')
			b.Write(v)
		}
		b.WriteByte('}')
	}
	b.WriteString("]\n")
	_, err := w.Write(b.Bytes())
	return err
}

// CellText renders one value of column col for a person (human: empty as
// "-", lists joined with ",", floats with two decimals) or for CSV (exact;
// lists joined with ";"). Times are RFC 3339 in UTC with milliseconds; a
// "day" column is a date.
func CellText(col string, v any, human bool) string {
	switch x := v.(type) {
	case time.Time:
		if col == "day" {
			return x.UTC().Format(time.DateOnly)
		}
		return x.UTC().Format(schemas.TimeFormat)
	case []string:
		if human {
			return orDash(strings.Join(x, ","))
		}
		return strings.Join(x, ";")
	case float64:
		if human {
			return strconv.FormatFloat(x, 'f', 2, 64)
		}
		return strconv.FormatFloat(x, 'f', -1, 64)
	case string:
		if human {
			return orDash(x)
		}
		return x
	}
	return fmt.Sprint(v)
}

// jsonValue is v as it goes into JSON: times as RFC 3339 strings (a "day"
// column as a date), everything else as is.
func jsonValue(col string, v any) any {
	if t, ok := v.(time.Time); ok {
		return CellText(col, t, false)
	}
	return v
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteCannedList writes the canned queries: a JSON array (name, help,
// view, columns, filters) with asJSON, else a table for a person.
func WriteCannedList(w io.Writer, asJSON bool, list []Canned) error {
	if asJSON {
		type canned struct {
			Name    string   `json:"name"`
			Help    string   `json:"help"`
			View    string   `json:"view"`
			Columns []string `json:"columns"`
			Filters []string `json:"filters"`
		}
		out := make([]canned, 0, len(list))
		for _, q := range list {
			out = append(out, canned{Name: q.Name, Help: q.Help, View: q.View, Columns: q.Columns, Filters: q.Filters})
		}
		return json.NewEncoder(w).Encode(out)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tFILTERS\tVIEW\tANSWERS")
	for _, q := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", q.Name, strings.Join(q.Filters, ","), q.View, q.Help)
	}
	return tw.Flush()
}

// WriteSecretUses writes the answer of SecretUses for pseudonym: one JSON
// object {"pseudonym","uses"} with asJSON, else a table and a count. The
// secret itself is never an argument: only its pseudonym is printed.
func WriteSecretUses(w io.Writer, asJSON bool, pseudonym string, uses []SecretUse) error {
	if asJSON {
		type use struct {
			Time       string `json:"time"`
			ToolCallID string `json:"tool_call_id"`
			AgentID    string `json:"agent_id"`
			ServerID   string `json:"server_id"`
			ToolName   string `json:"tool_name"`
			Pointer    string `json:"pointer"`
			Rule       string `json:"rule"`
		}
		out := struct {
			Pseudonym string `json:"pseudonym"`
			Uses      []use  `json:"uses"`
		}{Pseudonym: pseudonym, Uses: []use{}}
		for _, u := range uses {
			out.Uses = append(out.Uses, use{Time: u.Time.UTC().Format(schemas.TimeFormat), ToolCallID: u.ToolCallID,
				AgentID: u.AgentID, ServerID: u.ServerID, ToolName: u.ToolName, Pointer: u.Pointer, Rule: u.Rule})
		}
		return json.NewEncoder(w).Encode(out)
	}
	if len(uses) == 0 {
		_, err := fmt.Fprintf(w, "no recorded call used this secret (pseudonym %s)\n", pseudonym)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tTOOL_CALL_ID\tAGENT\tSERVER\tTOOL\tPOINTER\tRULE")
	for _, u := range uses {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", u.Time.UTC().Format(schemas.TimeFormat), u.ToolCallID,
			orDash(u.AgentID), orDash(u.ServerID), orDash(u.ToolName), u.Pointer, u.Rule)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d call(s) used this secret (pseudonym %s)\n", len(uses), pseudonym)
	return err
}
