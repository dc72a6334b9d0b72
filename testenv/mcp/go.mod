module github.com/talos-audit/talos/testenv/mcp

// This go.mod only keeps the npm packages in node_modules out of the
// main module (go vet ./..., go test ./...). There is no Go code here.

go 1.26
