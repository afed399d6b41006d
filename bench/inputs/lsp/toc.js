// Build a table of contents for a Markdown file: one list item per heading, linked to the
// anchor GitHub gives it. Usage: node toc.js README.md [--max-depth 3]
"use strict";

const fs = require("fs");

const HEADING = /^(#{1,6})\s+(.+?)\s*#*\s*$/;
const FENCE = /^(```|~~~)/;

function slugify(text, seen) {
  let slug = text
    .toLowerCase()
    .replace(/<[^>]+>/g, "")
    .replace(/[^\p{Letter}\p{Number}\s_-]/gu, "")
    .trim()
    .replace(/\s/g, "-");
  const count = seen.get(slug) || 0;
  seen.set(slug, count + 1);
  return count === 0 ? slug : `${slug}-${count}`;
}

function stripInline(text) {
  return text
    .replace(/!\[([^\]]*)\]\([^)]*\)/g, "$1")
    .replace(/\[([^\]]*)\]\([^)]*\)/g, "$1")
    .replace(/`([^`]*)`/g, "$1")
    .replace(/[*_]{1,3}([^*_]+)[*_]{1,3}/g, "$1");
}

function headings(markdown) {
  const found = [];
  let fence = null;
  for (const line of markdown.split(/\r?\n/)) {
    const opener = line.match(FENCE);
    if (opener) {
      if (fence === null) fence = opener[1];
      else if (opener[1] === fence) fence = null;
      continue;
    }
    if (fence !== null) continue;
    const match = line.match(HEADING);
    if (match) {
      found.push({ depth: match[1].length, text: stripInline(match[2]) });
    }
  }
  return found;
}

function toc(markdown, { maxDepth = 3, skipTitle = true } = {}) {
  const seen = new Map();
  let items = headings(markdown).map((h) => ({ ...h, slug: slugify(h.text, seen) }));
  if (skipTitle && items.length > 0 && items[0].depth === 1) {
    items = items.slice(1);
  }
  items = items.filter((h) => h.depth <= maxDepth);
  if (items.length === 0) return "";
  const top = Math.min(...items.map((h) => h.depth));
  return items
    .map((h) => `${"  ".repeat(h.depth - top)}- [${h.text}](#${h.slug})`)
    .join("\n");
}

function parseArgs(argv) {
  const options = { file: null, maxDepth: 3 };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--max-depth") {
      options.maxDepth = Number.parseInt(argv[++i], 10);
      if (!Number.isInteger(options.maxDepth) || options.maxDepth < 1) {
        throw new Error("--max-depth needs a positive whole number");
      }
    } else if (options.file === null) {
      options.file = argv[i];
    } else {
      throw new Error(`unexpected argument: ${argv[i]}`);
    }
  }
  if (options.file === null) throw new Error("usage: node toc.js FILE.md [--max-depth N]");
  return options;
}

function main() {
  let options;
  try {
    options = parseArgs(process.argv.slice(2));
  } catch (error) {
    console.error(error.message);
    process.exit(2);
  }
  const markdown = fs.readFileSync(options.file, "utf8");
  const result = toc(markdown, { maxDepth: options.maxDepth });
  process.stdout.write(result ? `${result}\n` : "");
}

module.exports = { slugify, headings, toc };

if (require.main === module) {
  main();
}
