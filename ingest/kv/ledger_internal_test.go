package kv

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/talos-audit/talos/enforce"
)

// TestLedgerRecordEncoding: the records written by hand decode as
// json.Marshal's would.
func TestLedgerRecordEncoding(t *testing.T) {
	for _, rec := range []enforce.PreRecord{
		{Decision: "allow", ReceiptID: "r", DecidedAt: "2026-11-25T00:00:00.000Z"},
		{Decision: "deny", ReceiptID: "r\"\\<", CapabilityIDs: []string{"a", "b\n"}, DecidedAt: "x"},
	} {
		for _, id := range [][2]string{{"", ""}, {"gw-1", "call-1"}} {
			want := rec
			want.EPID, want.ToolCallID = id[0], id[1]
			var got enforce.PreRecord
			if err := json.Unmarshal(appendPreRecord(nil, id[0], id[1], &rec), &got); err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("%+v (%q): got %+v, %v", rec, id, got, err)
			}
		}
	}
	for _, rec := range []enforce.IdemRecord{{RequestHash: "h", ToolCallID: "t"}, {RequestHash: "h", ToolCallID: "t", ReceiptID: "r\u2028"}, {RequestHash: "h", EPID: "gw", ToolCallID: "t"}} {
		var got enforce.IdemRecord
		if err := json.Unmarshal(appendIdemRecord(nil, &rec), &got); err != nil || got != rec {
			t.Errorf("%+v: got %+v, %v", rec, got, err)
		}
	}
}
