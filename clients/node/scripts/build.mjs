// Builds dist/esm (ES modules) and dist/cjs (CommonJS), each with its
// type declarations, from src/ with the TypeScript compiler.
import { execFileSync } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
const out = process.argv[2] ? process.argv[2] : join(root, 'dist');
rmSync(out, { recursive: true, force: true });
const build = (dir, module, resolution) =>
  execFileSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.json'), '--outDir', join(out, dir),
    '--module', module, '--moduleResolution', resolution], { stdio: 'inherit' });
build('esm', 'es2022', 'bundler');
build('cjs', 'commonjs', 'node10');
mkdirSync(join(out, 'cjs'), { recursive: true });
writeFileSync(join(out, 'cjs', 'package.json'), '{ "type": "commonjs" }\n');
