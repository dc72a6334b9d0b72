package query

import (
	"context"
	"fmt"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// ToolCallEvents returns the signed ToolCallEvent CloudEvents stored for
// the calls toolCallIDs of enforcement point epID, by tool_call_id, as
// v_tool_calls holds them (an id not yet projected is absent; another
// enforcement point's call with the same id is not returned). It is the
// event store the conformance run reads.
func ToolCallEvents(ctx context.Context, conn driver.Conn, database, epID string, toolCallIDs []string) (map[string][]byte, error) {
	out := map[string][]byte{}
	if len(toolCallIDs) == 0 {
		return out, nil
	}
	view, err := table(database, ViewToolCalls)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, "SELECT tool_call_id, cloudevent FROM "+view+" WHERE ep_id = ? AND has(?, tool_call_id)", epID, toolCallIDs)
	if err != nil {
		return nil, fmt.Errorf("query: tool call events: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, ce string
		if err := rows.Scan(&id, &ce); err != nil {
			return nil, fmt.Errorf("query: tool call events: %w", err)
		}
		out[id] = []byte(ce)
	}
	return out, rows.Err()
}
