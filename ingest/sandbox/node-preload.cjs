// Loaded by Node before a sandboxed upstream's own code (NODE_OPTIONS
// --require), when its sandbox has an egress allowlist. Node's built-in
// fetch() ignores HTTP_PROXY and HTTPS_PROXY before Node 24, so a server
// that fetches with it would have no way out of the sandbox: this installs
// undici's EnvHttpProxyAgent (npm undici 6.13 or later, found beside the
// server's own code) as the global dispatcher fetch() uses, so that it
// reaches the egress proxy those variables name. Without undici nothing is
// changed and fetch() has no network; the reason goes to stderr.
"use strict";
(function installEgressProxy() {
  const fs = require("node:fs");
  const path = require("node:path");
  const from = [process.cwd()];
  if (process.argv[1]) {
    try {
      from.unshift(path.dirname(fs.realpathSync(process.argv[1])));
    } catch {
      // not a file: search from the working directory only
    }
  }
  let undici;
  try {
    undici = require(require.resolve("undici", { paths: from }));
  } catch {
    process.stderr.write("talos sandbox: npm undici is not installed beside this server: its fetch() cannot use the egress proxy\n");
    return;
  }
  if (typeof undici.EnvHttpProxyAgent !== "function" || typeof undici.setGlobalDispatcher !== "function") {
    process.stderr.write("talos sandbox: the undici beside this server has no EnvHttpProxyAgent (6.13 or later has): its fetch() cannot use the egress proxy\n");
    return;
  }
  // The agent warns once that it is experimental; the server's own
  // stderr is no place for the gateway's choice of agent.
  const emitWarning = process.emitWarning;
  process.emitWarning = function (warning, options, ...rest) {
    if (options && options.code === "UNDICI-EHPA") return;
    return emitWarning.call(process, warning, options, ...rest);
  };
  try {
    undici.setGlobalDispatcher(new undici.EnvHttpProxyAgent());
  } finally {
    process.emitWarning = emitWarning;
  }
})();
