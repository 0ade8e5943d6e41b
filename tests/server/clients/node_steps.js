// node-postgres (the npm package pg) run as its users run it, by the steps a test gives it
// on standard input, one a line, tab-separated (tests/server/test_jdbc_node.py):
//   connect  USER  PASSWORD  [JSON]        (a new Client on TLS with the test CA,
//                                           verify-full; JSON: more Client options)
//   query    SQL   [PARAM...]              (client.query with parameters: extended protocol)
//   simple   SQL                           (no parameters: the simple query protocol)
//   named    NAME  SQL  [PARAM...]         (a named prepared statement)
// A PARAM is TYPE:VALUE: int and double (a number), str, bool, date (a JavaScript Date
// from ISO text), bytes (a Buffer from hex), json (an object from JSON), null.
// Each step prints one line: "ok " and its rows (a value as type:value, columns joined by
// " | ", rows by " ; "), or "err SQLSTATE message".
const { Client } = require('pg');
const fs = require('fs');
const readline = require('readline');

const [port, ca] = process.argv.slice(2);
let client = null;

function param(p) {
  const colon = p.indexOf(':');
  const type = p.slice(0, colon), v = p.slice(colon + 1);
  switch (type) {
    case 'int': case 'double': return Number(v);
    case 'str': return v;
    case 'bool': return v === 'true';
    case 'date': return new Date(v);
    case 'bytes': return Buffer.from(v, 'hex');
    case 'json': return JSON.parse(v);
    case 'null': return null;
    default: throw new Error('unknown parameter type ' + type);
  }
}

function show(v) {
  if (v === null) return 'null';
  if (Buffer.isBuffer(v)) return 'Buffer:' + v.toString('hex');
  if (v instanceof Date) return 'Date:' + v.toISOString();
  return typeof v + ':' + (typeof v === 'object' ? JSON.stringify(v) : String(v));
}

function rows(result) {
  const results = Array.isArray(result) ? result : [result];
  return results.map(r => (r.rows.length || !r.command ? r.rows.map(row => row.map(show).join(' | ')).join(' ; ')
                                                          : r.command + ' ' + (r.rowCount ?? ''))).join(' / ');
}

async function step(f) {
  switch (f[0]) {
    case 'connect': {
      if (client) await client.end();
      client = new Client({ host: 'localhost', port: Number(port), user: f[1], password: f[2],
                            database: 'db', ssl: { ca: fs.readFileSync(ca), rejectUnauthorized: true },
                            ...(f[3] ? JSON.parse(f[3]) : {}) });
      client.on('error', () => {});
      await client.connect();
      return 'connected';
    }
    case 'query':
      return rows(await client.query({ text: f[1], values: f.slice(2).map(param), rowMode: 'array' }));
    case 'simple':
      return rows(await client.query({ text: f[1], rowMode: 'array' }));
    case 'named':
      return rows(await client.query({ name: f[1], text: f[2], values: f.slice(3).map(param), rowMode: 'array' }));
    default: throw new Error('unknown step ' + f[0]);
  }
}

(async () => {
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    if (!line) continue;
    let out;
    try {
      out = 'ok ' + await step(line.split('\t'));
    } catch (e) {
      out = 'err ' + (e.code || 'none') + ' ' + e.message;
    }
    console.log(out.replace(/\n/g, ' '));
  }
  if (client) await client.end();
})();
