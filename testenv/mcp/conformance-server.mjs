#!/usr/bin/env node
// The streamable HTTP MCP server that the official conformance suite
// (@modelcontextprotocol/conformance, pinned in package.json) tests: every
// tool, resource, template and prompt its server scenarios name, built as
// each scenario's "Server Implementation Requirements" describe it, on the
// pinned @modelcontextprotocol/sdk with an in-memory event store (SSE
// resumability, SEP-1699) and the SDK's localhost Host/Origin checks.
// The conformance test (cmd/talos-mcp-gateway) runs the suite against it
// directly and through talos-mcp-gateway.
//
// Usage: node conformance-server.mjs [--port N]; it prints "listening <url>".
import { randomUUID } from "node:crypto";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { createMcpExpressApp } from "@modelcontextprotocol/sdk/server/express.js";
import { InMemoryEventStore } from "@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js";
import {
  CallToolRequestSchema, CompleteRequestSchema, GetPromptRequestSchema, ListPromptsRequestSchema,
  ListResourcesRequestSchema, ListResourceTemplatesRequestSchema, ListToolsRequestSchema,
  ReadResourceRequestSchema, SubscribeRequestSchema, UnsubscribeRequestSchema,
  CreateMessageResultSchema, ElicitResultSchema,
} from "@modelcontextprotocol/sdk/types.js";

// A 1x1 red PNG and a silent 8-sample WAV.
const PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
const WAV = "UklGRjQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQgAAACAgICAgICAgA==";
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const text = (t) => ({ type: "text", text: t });
const none = { type: "object", properties: {} };

const tools = [
  { name: "test_simple_text", description: "Returns simple text.", inputSchema: none },
  { name: "test_image_content", description: "Returns an image.", inputSchema: none },
  { name: "test_audio_content", description: "Returns audio.", inputSchema: none },
  { name: "test_embedded_resource", description: "Returns an embedded resource.", inputSchema: none },
  { name: "test_multiple_content_types", description: "Returns text, an image and a resource.", inputSchema: none },
  { name: "test_tool_with_logging", description: "Logs three messages while it runs.", inputSchema: none },
  { name: "test_error_handling", description: "Always fails.", inputSchema: none },
  { name: "test_tool_with_progress", description: "Reports progress while it runs.", inputSchema: none },
  { name: "test_sampling", description: "Asks the client's model.", inputSchema: { type: "object", properties: { prompt: { type: "string" } }, required: ["prompt"] } },
  { name: "test_elicitation", description: "Asks the user.", inputSchema: { type: "object", properties: { message: { type: "string" } }, required: ["message"] } },
  { name: "test_elicitation_sep1034_defaults", description: "Asks the user, with defaults.", inputSchema: none },
  { name: "test_elicitation_sep1330_enums", description: "Asks the user, with every kind of enum.", inputSchema: none },
  { name: "test_reconnection", description: "Closes its response stream mid-call; the client resumes it.", inputSchema: none },
  {
    name: "json_schema_2020_12_tool", description: "Tool with JSON Schema 2020-12 features",
    inputSchema: {
      $schema: "https://json-schema.org/draft/2020-12/schema", type: "object",
      $defs: { address: { type: "object", properties: { street: { type: "string" }, city: { type: "string" } } } },
      properties: { name: { type: "string" }, address: { $ref: "#/$defs/address" } },
      additionalProperties: false,
    },
  },
];

const defaultsSchema = {
  type: "object",
  properties: {
    name: { type: "string", description: "User name", default: "John Doe" },
    age: { type: "integer", description: "User age", default: 30 },
    score: { type: "number", description: "User score", default: 95.5 },
    status: { type: "string", description: "User status", enum: ["active", "inactive", "pending"], default: "active" },
    verified: { type: "boolean", description: "Verification status", default: true },
  },
};

const enumsSchema = {
  type: "object",
  properties: {
    untitledSingle: { type: "string", enum: ["option1", "option2", "option3"] },
    titledSingle: { type: "string", oneOf: [{ const: "value1", title: "First Option" }, { const: "value2", title: "Second Option" }, { const: "value3", title: "Third Option" }] },
    legacyEnum: { type: "string", enum: ["opt1", "opt2", "opt3"], enumNames: ["Option One", "Option Two", "Option Three"] },
    untitledMulti: { type: "array", items: { type: "string", enum: ["option1", "option2", "option3"] } },
    titledMulti: { type: "array", items: { anyOf: [{ const: "value1", title: "First Choice" }, { const: "value2", title: "Second Choice" }, { const: "value3", title: "Third Choice" }] } },
  },
};

async function callTool(server, req, extra) {
  const args = req.params.arguments ?? {};
  switch (req.params.name) {
    case "test_simple_text":
      return { content: [text("This is a simple text response for testing.")] };
    case "test_image_content":
      return { content: [{ type: "image", data: PNG, mimeType: "image/png" }] };
    case "test_audio_content":
      return { content: [{ type: "audio", data: WAV, mimeType: "audio/wav" }] };
    case "test_embedded_resource":
      return { content: [{ type: "resource", resource: { uri: "test://embedded-resource", mimeType: "text/plain", text: "This is an embedded resource content." } }] };
    case "test_multiple_content_types":
      return {
        content: [text("Multiple content types test:"), { type: "image", data: PNG, mimeType: "image/png" },
          { type: "resource", resource: { uri: "test://mixed-content-resource", mimeType: "application/json", text: JSON.stringify({ test: "data", value: 123 }) } }],
      };
    case "test_tool_with_logging":
      for (const [i, msg] of ["Tool execution started", "Tool processing data", "Tool execution completed"].entries()) {
        if (i > 0) await sleep(50);
        await extra.sendNotification({ method: "notifications/message", params: { level: "info", data: msg } });
      }
      return { content: [text("Tool with logging executed successfully")] };
    case "test_error_handling":
      return { isError: true, content: [text("This tool intentionally returns an error for testing")] };
    case "test_tool_with_progress": {
      const token = req.params._meta?.progressToken;
      for (const [i, progress] of [0, 50, 100].entries()) {
        if (i > 0) await sleep(50);
        if (token !== undefined) await extra.sendNotification({ method: "notifications/progress", params: { progressToken: token, progress, total: 100 } });
      }
      return { content: [text(String(token ?? "no progress token"))] };
    }
    case "test_sampling": {
      const res = await extra.sendRequest({ method: "sampling/createMessage", params: { messages: [{ role: "user", content: text(args.prompt) }], maxTokens: 100 } }, CreateMessageResultSchema);
      return { content: [text("LLM response: " + (res.content?.text ?? JSON.stringify(res.content)))] };
    }
    case "test_elicitation": {
      const res = await extra.sendRequest({
        method: "elicitation/create",
        params: {
          message: args.message,
          requestedSchema: { type: "object", properties: { username: { type: "string", description: "User's response" }, email: { type: "string", description: "User's email address" } }, required: ["username", "email"] },
        },
      }, ElicitResultSchema);
      return { content: [text("User response: " + JSON.stringify(res))] };
    }
    case "test_elicitation_sep1034_defaults":
    case "test_elicitation_sep1330_enums": {
      const schema = req.params.name.endsWith("defaults") ? defaultsSchema : enumsSchema;
      const res = await extra.sendRequest({ method: "elicitation/create", params: { message: "Please review and accept.", requestedSchema: schema } }, ElicitResultSchema);
      return { content: [text(`Elicitation completed: action=${res.action}, content=${JSON.stringify(res.content ?? {})}`)] };
    }
    case "test_reconnection":
      await sleep(100);
      extra.closeSSEStream?.();
      await sleep(200);
      return { content: [text("Reconnection test completed successfully")] };
    case "json_schema_2020_12_tool":
      return { content: [text("ok")] };
    default:
      throw new Error("unknown tool: " + req.params.name);
  }
}

const resources = [
  { uri: "test://static-text", name: "static-text", description: "A static text resource.", mimeType: "text/plain" },
  { uri: "test://static-binary", name: "static-binary", description: "A static binary resource.", mimeType: "image/png" },
  { uri: "test://watched-resource", name: "watched-resource", description: "A resource to subscribe to.", mimeType: "text/plain" },
];

function readResource(uri) {
  if (uri === "test://static-text") return [{ uri, mimeType: "text/plain", text: "This is the content of the static text resource." }];
  if (uri === "test://static-binary") return [{ uri, mimeType: "image/png", blob: PNG }];
  if (uri === "test://watched-resource") return [{ uri, mimeType: "text/plain", text: "Watched resource content." }];
  const m = /^test:\/\/template\/([^/]+)\/data$/.exec(uri);
  if (m) return [{ uri, mimeType: "application/json", text: JSON.stringify({ id: m[1], templateTest: true, data: `Data for ID: ${m[1]}` }) }];
  throw new Error("resource not found: " + uri);
}

const prompts = [
  { name: "test_simple_prompt", description: "A simple prompt." },
  { name: "test_prompt_with_arguments", description: "A prompt with arguments.", arguments: [{ name: "arg1", description: "First test argument", required: true }, { name: "arg2", description: "Second test argument", required: true }] },
  { name: "test_prompt_with_embedded_resource", description: "A prompt embedding a resource.", arguments: [{ name: "resourceUri", description: "URI of the resource to embed", required: true }] },
  { name: "test_prompt_with_image", description: "A prompt with an image." },
];

function getPrompt(name, args = {}) {
  switch (name) {
    case "test_simple_prompt":
      return [{ role: "user", content: text("This is a simple prompt for testing.") }];
    case "test_prompt_with_arguments":
      return [{ role: "user", content: text(`Prompt with arguments: arg1='${args.arg1}', arg2='${args.arg2}'`) }];
    case "test_prompt_with_embedded_resource":
      return [{ role: "user", content: { type: "resource", resource: { uri: args.resourceUri, mimeType: "text/plain", text: "Embedded resource content for testing." } } },
        { role: "user", content: text("Please process the embedded resource above.") }];
    case "test_prompt_with_image":
      return [{ role: "user", content: { type: "image", data: PNG, mimeType: "image/png" } }, { role: "user", content: text("Please analyze the image above.") }];
    default:
      throw new Error("unknown prompt: " + name);
  }
}

function newServer() {
  const server = new Server({ name: "talos-conformance-server", version: "1.0.0" }, {
    capabilities: { tools: {}, resources: { subscribe: true }, prompts: {}, logging: {}, completions: {} },
  });
  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools }));
  server.setRequestHandler(CallToolRequestSchema, (req, extra) => callTool(server, req, extra));
  server.setRequestHandler(ListResourcesRequestSchema, async () => ({ resources }));
  server.setRequestHandler(ListResourceTemplatesRequestSchema, async () => ({
    resourceTemplates: [{ uriTemplate: "test://template/{id}/data", name: "template", description: "A templated resource.", mimeType: "application/json" }],
  }));
  server.setRequestHandler(ReadResourceRequestSchema, async (req) => ({ contents: readResource(req.params.uri) }));
  server.setRequestHandler(SubscribeRequestSchema, async () => ({}));
  server.setRequestHandler(UnsubscribeRequestSchema, async () => ({}));
  server.setRequestHandler(ListPromptsRequestSchema, async () => ({ prompts }));
  server.setRequestHandler(GetPromptRequestSchema, async (req) => ({ messages: getPrompt(req.params.name, req.params.arguments) }));
  server.setRequestHandler(CompleteRequestSchema, async (req) => {
    const v = req.params.argument?.value ?? "";
    const values = ["paris", "park", "party"].filter((w) => w.startsWith(v));
    return { completion: { values, total: values.length, hasMore: false } };
  });
  return server;
}

const port = Number(process.argv[process.argv.indexOf("--port") + 1] || 0) || 0;
const app = createMcpExpressApp();
const transports = {};

app.post("/mcp", async (req, res) => {
  const id = req.headers["mcp-session-id"];
  let transport = id ? transports[id] : undefined;
  if (!transport) {
    if (id || req.body?.method !== "initialize") {
      res.status(400).json({ jsonrpc: "2.0", error: { code: -32000, message: "Invalid or missing session ID" }, id: null });
      return;
    }
    transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      eventStore: new InMemoryEventStore(),
      retryInterval: 500,
      onsessioninitialized: (sid) => { transports[sid] = transport; },
    });
    transport.onclose = () => { if (transport.sessionId) delete transports[transport.sessionId]; };
    await newServer().connect(transport);
  }
  await transport.handleRequest(req, res, req.body);
});

for (const method of ["get", "delete"]) {
  app[method]("/mcp", async (req, res) => {
    const transport = transports[req.headers["mcp-session-id"]];
    if (!transport) {
      res.status(400).send("Invalid or missing session ID");
      return;
    }
    await transport.handleRequest(req, res);
  });
}

const listener = app.listen(port, "127.0.0.1", () => {
  console.log(`listening http://localhost:${listener.address().port}/mcp`);
});
