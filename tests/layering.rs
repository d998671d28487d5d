//! No import circles (issues 22 and 33): in every crate of the workspace
//! (the module's glue `src/redis/`, the core `core/src/`, the client
//! `client/src/` and its command `client/src/bin/redis-lock/`, the test kit
//! `testkit/src/`), modules import one another only downwards. Reads the
//! sources (no server) and every form of import: `use crate::...`,
//! `use super::...`, `use self::...`, grouped and nested `use a::{b, c::{d}}`
//! over several lines, and paths in code (`super::node::mono_ms()`), in
//! files and in folders (`node/mod.rs`, `node/acquire.rs`). A folder's
//! `mod.rs` re-exporting its own children (`pub use acquire::X`) arranges
//! names and is no import; a file's unit tests (`mod tests`, last in the
//! file) may use anything. A cycle fails with its modules in order.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The modules of a crate's folder: `engine` for `engine.rs`, `node` for
/// `node.rs` or `node/mod.rs`, `node/acquire` for `node/acquire.rs`.
fn modules(root: &Path) -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("a source folder") {
            let path = entry.expect("a folder entry").path();
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            let name = match prefix {
                "" => stem.clone(),
                p => format!("{p}/{stem}"),
            };
            if path.is_dir() {
                if stem == "bin" || stem == "tests" {
                    continue; // other crates, or unit tests
                }
                walk(&path, &name, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                match stem.as_str() {
                    "mod" => {
                        out.insert(prefix.to_string(), path);
                    }
                    _ => {
                        out.insert(name, path);
                    }
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, "", &mut out);
    out
}

/// A source without its comments (line comments, doc comments and block
/// comments) and without its in-file unit tests (`mod tests { .. }`, last
/// in the file).
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut in_block = 0usize;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if in_block == 0
            && (trimmed.starts_with("mod tests") || trimmed.starts_with("pub mod tests"))
        {
            // `mod tests;` declares a file of its own (read as a module):
            // the code after it is still this file's.
            if trimmed.ends_with(';') {
                continue;
            }
            break;
        }
        let mut rest = line;
        let mut kept = String::new();
        loop {
            if in_block > 0 {
                match rest.find("*/") {
                    Some(end) => {
                        in_block -= 1;
                        rest = &rest[end + 2..];
                    }
                    None => break,
                }
            } else {
                let line_comment = rest.find("//");
                let block = rest.find("/*");
                match (line_comment, block) {
                    (Some(l), b) if b.is_none_or(|b| l < b) => {
                        kept.push_str(&rest[..l]);
                        break;
                    }
                    (Some(l), None) => {
                        kept.push_str(&rest[..l]);
                        break;
                    }
                    (_, Some(b)) => {
                        kept.push_str(&rest[..b]);
                        in_block += 1;
                        rest = &rest[b + 2..];
                    }
                    (None, None) => {
                        kept.push_str(rest);
                        break;
                    }
                }
            }
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

/// Every path a `use` tree names, each as its segments:
/// `a::{b, c::{d, e}}` is `a::b`, `a::c::d`, `a::c::e`.
fn use_paths(tree: &str) -> Vec<Vec<String>> {
    fn parse(s: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let s = s.trim();
        if s.is_empty() {
            return;
        }
        // Split at the first top-level `{`.
        match s.find('{') {
            None => {
                let mut path = prefix.to_vec();
                let plain = s.split(" as ").next().unwrap_or(s);
                path.extend(
                    plain
                        .split("::")
                        .map(|p| p.trim().to_string())
                        .filter(|p| !p.is_empty()),
                );
                out.push(path);
            }
            Some(open) => {
                let head = s[..open].trim_end_matches("::");
                let mut path = prefix.to_vec();
                path.extend(
                    head.split("::")
                        .map(|p| p.trim().to_string())
                        .filter(|p| !p.is_empty()),
                );
                let close = s.rfind('}').unwrap_or(s.len());
                let inner = &s[open + 1..close];
                // Top-level commas of the group.
                let (mut depth, mut start) = (0, 0);
                for (i, ch) in inner.char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            parse(&inner[start..i], &path, out);
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                parse(&inner[start..], &path, out);
            }
        }
    }
    let mut out = Vec::new();
    parse(tree, &[], &mut out);
    out
}

/// Every path of `code` that starts at `crate`, `super` or `self`: in `use`
/// statements (whole trees) and elsewhere in the code; `reexports` says
/// which come from a `pub use` (as a folder's `mod.rs` re-exports).
fn paths(code: &str) -> Vec<(Vec<String>, bool)> {
    let mut found = Vec::new();
    let mut rest = code;
    // `use` statements, up to their `;`, over several lines.
    let mut in_uses = String::new();
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        let statement_start =
            before.is_none_or(|c| c.is_whitespace() || c == ';' || c == '{' || c == '}');
        let after = &rest[at + 4..];
        if !statement_start {
            rest = after;
            continue;
        }
        let reexport =
            rest[..at].trim_end().ends_with("pub") || rest[..at].trim_end().ends_with(')');
        let end = after.find(';').unwrap_or(after.len());
        let tree = &after[..end];
        for p in use_paths(tree) {
            found.push((p, reexport));
        }
        in_uses.push_str(tree);
        rest = &after[end..];
    }
    // Paths in code: `crate::a::b`, `super::a`, `self::a` not in a `use`.
    let code_only = code.replace(&in_uses, "");
    for start in ["crate::", "super::", "self::"] {
        let mut rest = code_only.as_str();
        while let Some(at) = rest.find(start) {
            let before = rest[..at].chars().last();
            let tail = &rest[at..];
            rest = &rest[at + start.len()..];
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let path: String = tail
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let segments: Vec<String> = path
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            found.push((segments, false));
        }
    }
    found
}

/// The module a path names from `module` (`crate_root`: the segments that
/// lead from `crate` to this folder, `["redis"]` for src/redis), as the
/// longest prefix that is one of `known`; None outside this folder.
fn resolve(
    path: &[String],
    module: &str,
    crate_root: &[&str],
    known: &BTreeMap<String, PathBuf>,
) -> Option<String> {
    let mut here: Vec<String> = match module {
        "" => Vec::new(),
        m => m.split('/').map(str::to_string).collect(),
    };
    let mut segments = path.to_vec();
    let first = segments.first()?.clone();
    let mut absolute: Vec<String> = match first.as_str() {
        "crate" => {
            segments.remove(0);
            let root: Vec<String> = crate_root.iter().map(|s| s.to_string()).collect();
            if segments.len() < root.len() || segments[..root.len()] != root[..] {
                return None; // another part of the crate
            }
            segments.drain(..root.len());
            Vec::new()
        }
        "super" => {
            // A file module's `super` is its folder's module.
            while segments.first().is_some_and(|s| s == "super") {
                segments.remove(0);
                here.pop()?;
            }
            here.clone()
        }
        "self" => {
            segments.remove(0);
            here.clone()
        }
        _ => return None,
    };
    absolute.extend(segments);
    (1..=absolute.len())
        .rev()
        .map(|n| absolute[..n].join("/"))
        .find(|m| known.contains_key(m))
}

fn graph(dir: &str, crate_root: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let known = modules(&root);
    let mut graph = BTreeMap::new();
    for (module, file) in &known {
        let text = std::fs::read_to_string(file).expect("readable");
        let mut deps = BTreeSet::new();
        for (path, reexport) in paths(&code(&text)) {
            let Some(to) = resolve(&path, module, crate_root, &known) else {
                continue;
            };
            // A folder re-exporting its own children arranges names.
            let child = to.starts_with(&format!("{module}/")) || module.is_empty();
            if (reexport && child) || &to == module {
                continue;
            }
            // The crate root (lib.rs, main.rs) declares every module.
            if to.is_empty() {
                continue;
            }
            deps.insert(to);
        }
        graph.insert(module.clone(), deps);
    }
    graph
}

/// A cycle of `graph`, if it has one, as the modules along it.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|start| visit(start, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_parser_sees_every_form_of_import() {
    let text = "use super::{engine, timer::Inbox};\n\
                #[cfg(test)]\n\
                mod tests;\n\
                use super::after_a_test_file;\n\
                use crate::core::{\n    lock::{Lock, Mode},\n    node,\n};\n\
                pub use acquire::Request;\n\
                fn f() { let x = super::node::mono_ms(); crate::fence::check(); }\n\
                // use super::commented_out;\n\
                mod tests { use super::anything; }\n";
    let all: Vec<String> = paths(&code(text))
        .into_iter()
        .map(|(p, re)| format!("{}{}", p.join("::"), if re { " (re-export)" } else { "" }))
        .collect();
    for want in [
        "super::engine",
        "super::timer::Inbox",
        "crate::core::lock::Lock",
        "crate::core::lock::Mode",
        "crate::core::node",
        "acquire::Request (re-export)",
        "super::node::mono_ms",
        "crate::fence::check",
        "super::after_a_test_file",
    ] {
        assert!(all.contains(&want.to_string()), "{want} not in {all:?}");
    }
    assert!(
        !all.iter()
            .any(|p| p.contains("commented_out") || p.contains("anything")),
        "{all:?}"
    );
    let g: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a")]
        .iter()
        .map(|(k, v)| (k.to_string(), BTreeSet::from([v.to_string()])))
        .collect();
    assert_eq!(cycle(&g).map(|c| c.len()), Some(4));
}

#[test]
fn a_circle_through_a_folder_is_found() {
    // node/acquire imports the folder's module (super::Node) and the folder
    // imports a sibling that imports node/acquire: a circle. A re-export of
    // a child is not an import.
    let known: BTreeMap<String, PathBuf> = ["node", "node/acquire", "waiters"]
        .iter()
        .map(|m| (m.to_string(), PathBuf::new()))
        .collect();
    let seg = |p: &str| p.split("::").map(str::to_string).collect::<Vec<_>>();
    assert_eq!(
        resolve(&seg("super::Node"), "node/acquire", &[], &known).as_deref(),
        Some("node")
    );
    assert_eq!(
        resolve(&seg("crate::waiters::Line"), "node", &[], &known).as_deref(),
        Some("waiters")
    );
    assert_eq!(
        resolve(&seg("crate::node::acquire::f"), "waiters", &[], &known).as_deref(),
        Some("node/acquire")
    );
    assert_eq!(
        resolve(&seg("crate::redis::engine"), "x", &["redis"], &known),
        None
    );
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    // The last field says whether the crate's modules import each other
    // at all: a parser that reads nothing must not pass as "no circle".
    for (dir, crate_root, imports_between_modules) in [
        ("src/redis", &["redis"][..], true),
        ("core/src", &[][..], true),
        ("client/src", &[][..], true),
        ("client/src/bin/redis-lock", &[][..], true),
        ("testkit/src", &[][..], true),
    ] {
        let graph = graph(dir, crate_root);
        assert!(graph.len() > 1, "{dir}: no modules found");
        let edges: usize = graph.values().map(BTreeSet::len).sum();
        assert_eq!(
            edges > 0,
            imports_between_modules,
            "{dir}: {edges} imports read"
        );
        if let Some(found) = cycle(&graph) {
            panic!("{dir}: import circle {}", found.join(" -> "));
        }
    }
}

/// The glue's import table in ARCHITECTURE.md (under "Inside
/// `src/redis/`"): each row's modules and what they import.
fn documented_glue_imports() -> Vec<(Vec<String>, BTreeSet<String>)> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md"))
            .expect("ARCHITECTURE.md");
    let start = doc
        .find("Inside `src/redis/`")
        .expect("ARCHITECTURE.md has the glue's import table");
    let names = |cell: &str| -> Vec<String> {
        cell.split(',')
            .map(|s| s.trim().trim_matches('`').to_string())
            .filter(|s| !s.is_empty() && s != "nothing")
            .collect()
    };
    doc[start..]
        .lines()
        .skip_while(|l| !l.trim_start().starts_with('|'))
        .take_while(|l| l.trim_start().starts_with('|'))
        .filter_map(|l| {
            let cells: Vec<&str> = l.trim().trim_matches('|').split('|').collect();
            let [modules, imports] = cells[..] else {
                return None;
            };
            if modules.contains("module") || modules.contains("---") {
                return None;
            }
            Some((names(modules), names(imports).into_iter().collect()))
        })
        .collect()
}

/// The glue's imports, a folder's files read as the folder (what the
/// table names), its unit tests left out.
fn glue_imports() -> BTreeMap<String, BTreeSet<String>> {
    let top = |m: &str| m.split('/').next().unwrap().to_string();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, deps) in graph("src/redis", &["redis"]) {
        if module.is_empty() || module.ends_with("/tests") {
            continue;
        }
        let entry = out.entry(top(&module)).or_default();
        entry.extend(deps.iter().map(|d| top(d)).filter(|d| *d != top(&module)));
    }
    out
}

#[test]
fn the_architectures_import_table_is_the_glues() {
    let documented = documented_glue_imports();
    let actual = glue_imports();
    let as_table = || {
        actual
            .iter()
            .map(|(m, d)| {
                let d: Vec<_> = d.iter().map(|d| format!("`{d}`")).collect();
                format!("| `{m}` | {} |", d.join(", "))
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut listed = BTreeSet::new();
    for (i, (modules, imports)) in documented.iter().enumerate() {
        for module in modules {
            listed.insert(module.clone());
            let real = actual.get(module).unwrap_or_else(|| {
                panic!(
                    "ARCHITECTURE.md lists `{module}`, not a glue module; they are:\n{}",
                    as_table()
                )
            });
            assert_eq!(
                real,
                imports,
                "ARCHITECTURE.md: `{module}` imports {real:?}; the glue's imports are:\n{}",
                as_table()
            );
            // From the top down: what a row imports is listed below it.
            let below: BTreeSet<&String> = documented[i + 1..].iter().flat_map(|r| &r.0).collect();
            for import in imports {
                assert!(
                    below.contains(import),
                    "ARCHITECTURE.md: `{module}` imports `{import}`, not listed below it"
                );
            }
        }
    }
    let missing: Vec<_> = actual.keys().filter(|m| !listed.contains(*m)).collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's import table lacks {missing:?}; the glue's imports are:\n{}",
        as_table()
    );
}

/// Lines of code in a source: no blank line, no comment, no in-file unit
/// tests.
fn code_lines(text: &str) -> usize {
    code(text).lines().filter(|l| !l.trim().is_empty()).count()
}

#[test]
fn code_lines_count_code_only() {
    let text = "//! doc\nuse a;\n\n/* block\n comment */\nfn f() {} // note\n#[cfg(test)]\nmod tests {\n fn t() {}\n}\n";
    // `use a;`, `fn f() {}`, `#[cfg(test)]`.
    assert_eq!(code_lines(text), 3);
}

/// Files with one job each: no source file over 1,000 lines of code, and a
/// glue file (`src/redis/`) at most 500. Unit-test files (`tests.rs`)
/// aside, as in-file unit tests are.
#[test]
fn no_source_file_is_too_long() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut too_long = Vec::new();
    let mut read = 0;
    for (dir, limit) in [
        ("src/redis", 500),
        ("src", 1000),
        ("core/src", 1000),
        ("client/src", 1000),
        ("testkit/src", 1000),
    ] {
        let mut stack = vec![root.join(dir)];
        while let Some(folder) = stack.pop() {
            for entry in std::fs::read_dir(&folder).expect("a source folder") {
                let path = entry.expect("a folder entry").path();
                if path.is_dir() {
                    // src/redis has its own, lower limit.
                    if !(dir == "src" && path.ends_with("redis")) {
                        stack.push(path);
                    }
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") || path.ends_with("tests.rs") {
                    continue;
                }
                read += 1;
                let lines = code_lines(&std::fs::read_to_string(&path).expect("readable"));
                if lines > limit {
                    let shown = path.strip_prefix(root).unwrap().display().to_string();
                    too_long.push(format!("{shown}: {lines} lines of code (at most {limit})"));
                }
            }
        }
    }
    assert!(read > 50, "{read} source files read");
    assert!(too_long.is_empty(), "{}", too_long.join("\n"));
}
