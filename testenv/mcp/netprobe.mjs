#!/usr/bin/env node
// A stdio MCP server with one tool, `connect`, that tries to open a TCP
// connection the way a network-using tool would: `via: "direct"` dials
// host:port itself; `via: "proxy"` goes through the HTTP proxy named by
// HTTPS_PROXY (a CONNECT tunnel), as proxy-aware clients do. On success it
// sends one line ("ping from netprobe") and reports "connected"; otherwise
// the result is an error naming why. The sandbox tests
// (cmd/talos-mcp-gateway) run it as an upstream to show that egress is
// blocked or allowed. No dependencies: JSON-RPC over newline-delimited stdio.
import net from "node:net";
import readline from "node:readline";

const TIMEOUT_MS = 5000;

function send(msg) {
  process.stdout.write(JSON.stringify({ jsonrpc: "2.0", ...msg }) + "\n");
}

function withTimeout(sock, reject) {
  sock.setTimeout(TIMEOUT_MS, () => {
    sock.destroy();
    reject(new Error("timeout"));
  });
}

function direct(host, port) {
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host, port }, () => {
      sock.end("ping from netprobe\n");
      resolve("connected");
    });
    sock.on("error", reject);
    withTimeout(sock, reject);
  });
}

function viaProxy(host, port) {
  const proxy = process.env.HTTPS_PROXY || process.env.https_proxy;
  if (!proxy) return Promise.reject(new Error("no proxy configured"));
  const u = new URL(proxy);
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host: u.hostname, port: Number(u.port || 80) }, () => {
      sock.write(`CONNECT ${host}:${port} HTTP/1.1\r\nHost: ${host}:${port}\r\n\r\n`);
    });
    let head = "";
    sock.on("data", (chunk) => {
      head += chunk.toString("latin1");
      const end = head.indexOf("\r\n\r\n");
      if (end < 0) return;
      const status = head.slice(0, head.indexOf("\r\n"));
      if (/^HTTP\/1\.[01] 200/.test(status)) {
        sock.end("ping from netprobe\n");
        resolve("connected");
      } else {
        sock.destroy();
        reject(new Error("proxy refused: " + status));
      }
    });
    sock.on("error", reject);
    withTimeout(sock, reject);
  });
}

const tool = {
  name: "connect",
  description: "Open a TCP connection to host:port, directly or through HTTPS_PROXY.",
  inputSchema: {
    type: "object",
    properties: {
      host: { type: "string" },
      port: { type: "integer" },
      via: { type: "string", enum: ["direct", "proxy"] },
    },
    required: ["host", "port", "via"],
  },
};

async function handle(req) {
  switch (req.method) {
    case "initialize":
      return {
        protocolVersion: req.params?.protocolVersion ?? "2025-06-18",
        capabilities: { tools: {} },
        serverInfo: { name: "netprobe", version: "1.0.0" },
      };
    case "tools/list":
      return { tools: [tool] };
    case "tools/call": {
      const { host, port, via } = req.params?.arguments ?? {};
      try {
        const text = await (via === "proxy" ? viaProxy(host, port) : direct(host, port));
        return { content: [{ type: "text", text }] };
      } catch (e) {
        return { content: [{ type: "text", text: "not connected: " + e.message }], isError: true };
      }
    }
    case "ping":
      return {};
    default:
      throw { code: -32601, message: "method not found: " + req.method };
  }
}

readline.createInterface({ input: process.stdin }).on("line", async (line) => {
  if (!line.trim()) return;
  let req;
  try {
    req = JSON.parse(line);
  } catch {
    return send({ id: null, error: { code: -32700, message: "parse error" } });
  }
  if (req.id === undefined) return; // a notification
  try {
    send({ id: req.id, result: await handle(req) });
  } catch (e) {
    send({ id: req.id, error: { code: e.code ?? -32603, message: e.message ?? String(e) } });
  }
});
