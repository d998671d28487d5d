//! No import circles (issue 22): the modules of the glue (`src/redis/`),
//! of the client (`client/src/`) and of the core (`core/src/`) each import
//! one another only downwards. Reads the sources (no server): every `use
//! super::...` / `use crate::...` (and `super::x::` / `crate::x::` paths in
//! code) names an edge, except in a file's unit tests (`mod tests`, last
//! in the file); a cycle fails with its modules in order.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The module files of `dir` and, for each, the sibling modules it names.
fn imports(dir: &str, prefix: &str) -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(&root).expect("a source folder") {
        let path = entry.expect("a folder entry").path();
        if path.extension().is_some_and(|e| e == "rs") {
            let stem = path.file_stem().expect("a file name");
            names.insert(stem.to_string_lossy().into_owned());
        }
    }
    let mut graph = BTreeMap::new();
    for name in &names {
        let text = std::fs::read_to_string(root.join(format!("{name}.rs"))).expect("readable");
        let mut deps = BTreeSet::new();
        for line in text.lines() {
            let line = line.trim_start();
            if line.starts_with("mod tests") {
                break; // a file's unit tests (last) may use anything
            }
            if line.starts_with("//") {
                continue;
            }
            deps.extend(
                named(line, prefix)
                    .into_iter()
                    .filter(|d| names.contains(d)),
            );
        }
        deps.remove(name);
        deps.remove("lib");
        deps.remove("mod");
        graph.insert(name.clone(), deps);
    }
    graph
}

/// The modules a line names after `prefix::`, also inside `prefix::{a, b}`.
fn named(line: &str, prefix: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let pattern = format!("{prefix}::");
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find(&pattern) {
        let before = rest[..at].chars().last();
        rest = &rest[at + pattern.len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue; // `self::super::` or `foo_super::`: not ours
        }
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or("");
            found.extend(group.split(',').map(|p| ident(p.trim())));
        } else {
            found.push(ident(rest));
        }
    }
    found.retain(|m| !m.is_empty() && m != "self");
    found
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
fn the_parser_sees_grouped_and_path_imports() {
    assert_eq!(
        named("use super::{engine, timer::Inbox};", "super"),
        ["engine", "timer"]
    );
    assert_eq!(
        named("    let x = super::node::mono_ms();", "super"),
        ["node"]
    );
    assert!(named("use crate::core::Lock;", "super").is_empty());
    let g: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a")]
        .iter()
        .map(|(k, v)| (k.to_string(), BTreeSet::from([v.to_string()])))
        .collect();
    assert_eq!(cycle(&g).map(|c| c.len()), Some(4));
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    for (dir, prefix) in [
        ("src/redis", "super"),
        ("client/src", "crate"),
        ("client/src/bin/redis-lock", "crate"),
        ("core/src", "crate"),
    ] {
        let graph = imports(dir, prefix);
        assert!(graph.len() > 1, "{dir}: no modules found");
        if let Some(found) = cycle(&graph) {
            panic!("{dir}: import circle {}", found.join(" -> "));
        }
    }
}
