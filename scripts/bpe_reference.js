#!/usr/bin/env node
// The reference GPT-2 encoder: runs the npm package gpt-3-encoder (1.1.4, installed by
// scripts/setup.sh) unmodified over text files and prints each file's token ids as one JSON array
// per line, in the order the files were given. `atoll data check-tokenizer` and the data tests
// compare atoll's tokenizer against this output.
//
//   node scripts/bpe_reference.js [--package DIR] FILE...
//
// DIR is the installed package (default: $ATOLL_CACHE_DIR or .cache, then
// npm/node_modules/gpt-3-encoder, relative to the working directory). Files are read as node
// reads UTF-8 ('utf8': invalid bytes become U+FFFD, a byte-order mark is kept). An id the
// package cannot produce (undefined) prints as null.
'use strict';
const fs = require('fs');
const path = require('path');

const args = process.argv.slice(2);
let pkg = path.join(process.env.ATOLL_CACHE_DIR || '.cache', 'npm/node_modules/gpt-3-encoder');
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--package') {
    pkg = args[++i];
  } else if (args[i] === '--help' || args[i] === '-h') {
    process.stdout.write('usage: node scripts/bpe_reference.js [--package DIR] FILE...\n');
    process.exit(0);
  } else {
    files.push(args[i]);
  }
}

const encoderJs = path.resolve(pkg, 'Encoder.js');
if (!fs.existsSync(encoderJs)) {
  process.stderr.write(`bpe_reference.js: ${encoderJs} not found: run scripts/setup.sh\n`);
  process.exit(2);
}
const {encode} = require(encoderJs);

for (const file of files) {
  let text;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    process.stderr.write(`bpe_reference.js: reading ${file}: ${e.message}\n`);
    process.exit(2);
  }
  // JSON.stringify writes undefined array elements as null. Writes to a pipe are synchronous
  // on Linux, so nothing is lost when node exits.
  process.stdout.write(JSON.stringify(encode(text)) + '\n');
}
