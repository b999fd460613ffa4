// Start kinesalite or dynalite in memory on a free loopback port and write the port to a file.
// Usage: node emulator.js <module-dir> <port-file> [host]. Neither package has a host flag, hence this launcher.
"use strict";
const fs = require("fs");
const moduleDir = process.argv[2];
const portFile = process.argv[3];
const host = process.argv[4] || "127.0.0.1";
const create = require(moduleDir);
const server = create({
  // Tables and streams become ACTIVE at once; the real services take seconds.
  createStreamMs: 0, deleteStreamMs: 0, updateStreamMs: 0, shardLimit: 10000,
  createTableMs: 0, deleteTableMs: 0, updateTableMs: 0,
});
server.listen(0, host, () => {
  // written whole, then renamed: the parent never reads a half-written port
  fs.writeFileSync(portFile + ".tmp", server.address().port + "\n");
  fs.renameSync(portFile + ".tmp", portFile);
});
// A client killed in the middle of a request (kill -9 in the chaos tests and benchmarks) resets its connection;
// kinesalite and dynalite rethrow that from the request's error handler, which would end the whole emulator.
// It concerns that one connection only: note it and carry on. Anything else still ends the process.
process.on("uncaughtException", (err) => {
  if (err && (err.code === "ECONNRESET" || err.code === "EPIPE" || err.message === "aborted")) {
    process.stderr.write("emulator: a client connection was reset mid-request (" + err.message + ")\n");
    return;
  }
  process.stderr.write("emulator: " + ((err && err.stack) || err) + "\n");
  process.exit(1);
});
const stop = () => server.close(() => process.exit(0));
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
process.on("SIGHUP", stop);
