package query

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// grafanaDir is deploy/grafana, which docker-compose mounts into Grafana.
const grafanaDir = "../deploy/grafana"

// grafanaDashboard is the part of a dashboard JSON the test reads.
type grafanaDashboard struct {
	UID    string `json:"uid"`
	Title  string `json:"title"`
	Panels []struct {
		ID         int    `json:"id"`
		Title      string `json:"title"`
		Type       string `json:"type"`
		Datasource struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			RefID      string `json:"refId"`
			EditorType string `json:"editorType"`
			RawSQL     string `json:"rawSql"`
			Datasource struct {
				Type string `json:"type"`
				UID  string `json:"uid"`
			} `json:"datasource"`
		} `json:"targets"`
	} `json:"panels"`
}

var (
	// Macros of grafana-clickhouse-datasource v4 and Grafana's global
	// variables the dashboards use.
	grafanaTimeFilter = regexp.MustCompile(`\$__timeFilter\(\s*([a-z_]+)\s*\)`)
	// Every table a query names: FROM or JOIN, then a name (after
	// grafanaArrayJoin took ARRAY JOIN, which names a column, away).
	grafanaSource    = regexp.MustCompile(`(?i)\b(?:FROM|JOIN)\s+([a-z_][a-z0-9_.]*)`)
	grafanaArrayJoin = regexp.MustCompile(`(?i)\bARRAY\s+JOIN\b`)
)

// grafanaSQL substitutes the macros as the plugin would for [from, to] and
// points the query at database db instead of talos.
func grafanaSQL(sql, db string, from, to time.Time) string {
	f, t := fmt.Sprint(from.Unix()), fmt.Sprint(to.Unix())
	sql = grafanaTimeFilter.ReplaceAllString(sql, "$1 >= toDateTime("+f+") AND $1 <= toDateTime("+t+")")
	sql = strings.NewReplacer(
		"$__fromTime", "toDateTime("+f+")", "$__toTime", "toDateTime("+t+")",
		"$__from", fmt.Sprint(from.UnixMilli()), "$__to", fmt.Sprint(to.UnixMilli()),
	).Replace(sql)
	return strings.ReplaceAll(sql, "talos.v_", "`"+db+"`.v_")
}

// The provisioned Grafana is built on the views: every panel of every
// dashboard reads only talos.v_* views through the provisioned ClickHouse
// data source, every auditor view has a panel, and every panel's SQL runs
// on the test ClickHouse (macros substituted) as the data source's
// read-only user and shows the workload.
func TestGrafanaDashboards(t *testing.T) {
	ds, err := os.ReadFile(filepath.Join(grafanaDir, "provisioning", "datasources", "talos-clickhouse.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"type: grafana-clickhouse-datasource", "uid: talos-clickhouse", "host: clickhouse", "port: 9440", "secure: true",
		"protocol: native", "defaultDatabase: talos", "username: " + ReaderUser, "secureJsonData:", "password: $__file{/chreader/"} {
		if !strings.Contains(string(ds), want) {
			t.Errorf("datasource provisioning lacks %q", want)
		}
	}
	prov, err := os.ReadFile(filepath.Join(grafanaDir, "provisioning", "dashboards", "talos.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(prov), "path: /var/lib/grafana/dashboards") {
		t.Errorf("dashboard provider does not load /var/lib/grafana/dashboards:\n%s", prov)
	}

	files, err := filepath.Glob(filepath.Join(grafanaDir, "dashboards", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in %s/dashboards (%v)", grafanaDir, err)
	}
	ctx, addr, conn, db := migratedAt(t)
	loadAuditWorkload(t, ctx, conn, db)
	reader := loginAs(t, ctx, addr, ReaderUser) // the data source's user
	from, to := wlH0.Add(-time.Hour), wlH0.Add(48*time.Hour)

	views := map[string]bool{}
	for _, v := range []string{ViewReceipts, ViewDecisions, ViewDenialsByReason, ViewControlEvents, ViewToolCalls, ViewSecretUses,
		ViewRedactionCounts, ViewDenials, ViewWriteCalls, ViewIncidentTimeline, ViewKillSwitchIntervals, ViewCallsDuringKillSwitch,
		ViewRegistryDigests, ViewToolLatency} {
		views[v] = true
	}
	used := map[string]bool{}
	panels := 0
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var d grafanaDashboard
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
			t.Errorf("%s: uid %q, title %q, %d panels", file, d.UID, d.Title, len(d.Panels))
		}
		ids := map[int]bool{}
		for _, p := range d.Panels {
			panels++
			name := fmt.Sprintf("%s panel %d %q", filepath.Base(file), p.ID, p.Title)
			if ids[p.ID] {
				t.Errorf("%s: duplicate panel id", name)
			}
			ids[p.ID] = true
			if p.Datasource.UID != "talos-clickhouse" || p.Datasource.Type != "grafana-clickhouse-datasource" || len(p.Targets) == 0 {
				t.Errorf("%s: datasource %+v, %d targets", name, p.Datasource, len(p.Targets))
			}
			for _, tg := range p.Targets {
				if tg.EditorType != "sql" || tg.Datasource.UID != "talos-clickhouse" {
					t.Errorf("%s/%s: editor %q, datasource %q", name, tg.RefID, tg.EditorType, tg.Datasource.UID)
				}
				srcs := grafanaSource.FindAllStringSubmatch(grafanaArrayJoin.ReplaceAllString(tg.RawSQL, "ARRAY_JOIN"), -1)
				if len(srcs) == 0 {
					t.Errorf("%s: no FROM in %q", name, tg.RawSQL)
				}
				for _, m := range srcs {
					v, ok := strings.CutPrefix(m[1], "talos.")
					if !ok || !views[v] {
						t.Errorf("%s reads %s: panels read only the talos.v_* views", name, m[1])
					}
					used[v] = true
				}
				sql := grafanaSQL(tg.RawSQL, db, from, to)
				if strings.Contains(sql, "$") {
					t.Errorf("%s: a macro the test does not know is left in %q", name, sql)
				}
				rows, err := reader.Query(ctx, sql)
				if err != nil {
					t.Errorf("%s does not run on ClickHouse as %s: %v\n%s", name, ReaderUser, err, sql)
					continue
				}
				n := 0
				for rows.Next() {
					n++
				}
				if err := rows.Err(); err != nil {
					t.Errorf("%s: %v", name, err)
				}
				rows.Close()
				if n == 0 {
					t.Errorf("%s shows nothing for the workload:\n%s", name, sql)
				}
			}
		}
	}
	for _, v := range []string{ViewDecisions, ViewDenialsByReason, ViewDenials, ViewWriteCalls, ViewIncidentTimeline,
		ViewKillSwitchIntervals, ViewCallsDuringKillSwitch, ViewRegistryDigests, ViewRedactionCounts, ViewToolLatency, ViewSecretUses} {
		if !used[v] {
			t.Errorf("no Grafana panel reads %s", v)
		}
	}
	t.Logf("%d panels on %d views ran on ClickHouse", panels, len(used))
	if !slices.Contains(files, filepath.Join(grafanaDir, "dashboards", "talos-audit.json")) {
		t.Errorf("dashboards: %v", files)
	}
}
