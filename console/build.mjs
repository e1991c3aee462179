// Builds the console into OUT (default ../build/console/dist; OUT is emptied first): index.html, assets/app.js and
// assets/app.css (esbuild: one minified bundle of src/main.js and the CSS it imports).
// `node build.mjs [OUT]`. No request at run time leaves the relay's origin: everything the
// pages use is in these files.
import { build } from "esbuild";
import { copyFileSync, mkdirSync, rmSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(process.argv[2] ?? join(here, "..", "build", "console", "dist"));
rmSync(out, { recursive: true, force: true });
mkdirSync(join(out, "assets"), { recursive: true });
await build({
  entryPoints: { app: join(here, "src", "main.js") },
  outdir: join(out, "assets"),
  bundle: true,
  minify: true,
  format: "esm",
  target: ["chrome110", "firefox110", "safari16"],
  legalComments: "none",
  logLevel: "warning",
});
copyFileSync(join(here, "src", "index.html"), join(out, "index.html"));
console.log(`console built in ${out}`);
