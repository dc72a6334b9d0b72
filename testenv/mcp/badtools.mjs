#!/usr/bin/env node
// A stdio MCP server that lists, beside good definitions, some that no
// client can be served: a tool whose input schema has no "type": "object"
// (what newer zod versions emit, and the Go SDK refuses), one whose schema
// does not compile, one that does not decode as a tool at all, a nameless
// prompt, a relative resource URI and a broken URI template. Calling
// `spoil` adds one more bad tool and one good one and announces the new
// list (notifications/tools/list_changed). The robustness tests
// (cmd/talos-mcp-gateway) run it behind the gateway and under talosctl
// registry lint. No dependencies: JSON-RPC over newline-delimited stdio.
import readline from "node:readline";

let spoiled = false;

function send(msg) {
  process.stdout.write(JSON.stringify({ jsonrpc: "2.0", ...msg }) + "\n");
}

const object = { type: "object", properties: {} };

function tools() {
  const list = [
    { name: "hello", description: "Say hello.", inputSchema: { type: "object", properties: { name: { type: "string" } } } },
    { name: "spoil", description: "List two more tools, one of them broken.", inputSchema: object },
    { name: "no_type", description: "Input schema without a type.", inputSchema: { properties: { x: { type: "string" } } } },
    { name: "bad_schema", description: "Input schema that does not compile.", inputSchema: { type: "object", properties: { x: { type: 5 } } } },
    { name: 7, description: "Not a tool: its name is a number.", inputSchema: object },
  ];
  if (spoiled) {
    list.push({ name: "late_good", description: "Added by spoil.", inputSchema: object });
    list.push({ name: "late_bad", description: "Added by spoil, broken.", inputSchema: "not a schema" });
  }
  return list;
}

const prompts = [
  { name: "greeting", description: "A greeting.", arguments: [{ name: "who", required: false }] },
  { description: "A prompt without a name." },
];

const resources = [
  { uri: "test://good", name: "good", mimeType: "text/plain" },
  { uri: "relative/path", name: "relative" },
];

const templates = [
  { uriTemplate: "test://item/{id}", name: "item" },
  { uriTemplate: "test://item/{id", name: "broken" },
];

function handle(req) {
  switch (req.method) {
    case "initialize":
      return {
        protocolVersion: req.params?.protocolVersion ?? "2025-06-18",
        capabilities: { tools: { listChanged: true }, prompts: {}, resources: {} },
        serverInfo: { name: "badtools", version: "1.0.0" },
      };
    case "tools/list":
      return { tools: tools() };
    case "prompts/list":
      return { prompts };
    case "resources/list":
      return { resources };
    case "resources/templates/list":
      return { resourceTemplates: templates };
    case "prompts/get":
      return { messages: [{ role: "user", content: { type: "text", text: "Hello, " + (req.params?.arguments?.who ?? "you") + "!" } }] };
    case "resources/read":
      return { contents: [{ uri: req.params?.uri, mimeType: "text/plain", text: "content of " + req.params?.uri }] };
    case "tools/call": {
      const name = req.params?.name;
      if (name === "hello" || name === "late_good") {
        return { content: [{ type: "text", text: "Hello, " + (req.params?.arguments?.name ?? "you") + "!" }] };
      }
      if (name === "spoil") {
        spoiled = true;
        setImmediate(() => send({ method: "notifications/tools/list_changed" }));
        return { content: [{ type: "text", text: "two more tools" }] };
      }
      throw { code: -32602, message: "unknown tool: " + name };
    }
    case "ping":
      return {};
    default:
      throw { code: -32601, message: "method not found: " + req.method };
  }
}

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  if (!line.trim()) return;
  let req;
  try {
    req = JSON.parse(line);
  } catch {
    return send({ id: null, error: { code: -32700, message: "parse error" } });
  }
  if (req.id === undefined) return; // a notification
  try {
    send({ id: req.id, result: handle(req) });
  } catch (e) {
    send({ id: req.id, error: { code: e.code ?? -32603, message: e.message ?? String(e) } });
  }
});
