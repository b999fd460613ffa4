// Start kinesalite or dynalite in memory on a free loopback port and print "READY <port>".
// Usage: node emulator.js <module-dir> [host]. Neither package has a host flag, hence this launcher.
"use strict";
const moduleDir = process.argv[2];
const host = process.argv[3] || "127.0.0.1";
const create = require(moduleDir);
const server = create({
  // Tables and streams become ACTIVE at once; the real services take seconds.
  createStreamMs: 0, deleteStreamMs: 0, updateStreamMs: 0, shardLimit: 10000,
  createTableMs: 0, deleteTableMs: 0, updateTableMs: 0,
});
server.listen(0, host, () => {
  process.stdout.write("READY " + server.address().port + "\n");
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
